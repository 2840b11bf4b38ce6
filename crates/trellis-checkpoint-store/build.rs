//! Rebuilds the crate when a migration changes: `sqlx::migrate!` embeds the `migrations/`
//! directory at compile time, and Cargo does not see it otherwise.

fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
