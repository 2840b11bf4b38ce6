//! Compiles `proto/trellis/v1/*.proto` into Rust without a system `protoc`.
//!
//! `protox` (a protobuf compiler in Rust) parses the files into a `FileDescriptorSet`, kept with its
//! source info so the `.proto` comments become rustdoc and reach gRPC reflection clients. The set is
//! written to `OUT_DIR/trellis_descriptor.bin` (exposed as `FILE_DESCRIPTOR_SET`) and handed to
//! `tonic-prost-build`, which generates the prost messages and the tonic clients and servers.

use std::error::Error;
use std::path::{Path, PathBuf};
use std::{env, fs};

fn main() -> Result<(), Box<dyn Error>> {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?);
    let proto_root = manifest_dir.join("../../proto");
    let package_dir = proto_root.join("trellis/v1");
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);

    // Watching the directory catches added and removed files; each file is listed too because
    // cargo only compares a directory's own mtime, which an in-place edit does not change.
    println!("cargo:rerun-if-changed={}", package_dir.display());
    let proto_files = list_proto_files(&package_dir)?;
    for proto_file in &proto_files {
        println!("cargo:rerun-if-changed={}", proto_file.display());
    }

    let mut compiler = protox::Compiler::new([&proto_root])?;
    compiler.include_source_info(true).include_imports(true);
    for proto_file in &proto_files {
        // protox's `Display` names the file and the problem; its `Debug` is a wall of structs.
        compiler
            .open_file(proto_file)
            .map_err(|err| format!("failed to compile {}: {err}", proto_file.display()))?;
    }
    fs::write(
        out_dir.join("trellis_descriptor.bin"),
        compiler.encode_file_descriptor_set(),
    )?;

    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .out_dir(&out_dir)
        .compile_fds(compiler.file_descriptor_set())?;
    Ok(())
}

/// Returns the `.proto` files of one directory, sorted so the generated code does not depend on
/// the order the file system lists them in.
fn list_proto_files(dir: &Path) -> Result<Vec<PathBuf>, Box<dyn Error>> {
    let mut proto_files = Vec::new();
    for entry in
        fs::read_dir(dir).map_err(|err| format!("failed to read {}: {err}", dir.display()))?
    {
        let path = entry?.path();
        if path.extension().is_some_and(|ext| ext == "proto") {
            proto_files.push(path);
        }
    }
    proto_files.sort();
    Ok(proto_files)
}
