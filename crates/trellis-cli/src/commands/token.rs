//! `trellis token`: bearer tokens for the access file. A token is shown once, when it is made;
//! the access file holds only its SHA-256, so the file reveals no token.

use std::io::{self, BufRead, Write};
use std::process::ExitCode;

use clap::{Args, Subcommand};
use trellis_grpc::access;

use super::{Failure, exit};

/// Make bearer tokens and the access-file lines that let them in.
#[derive(Debug, Subcommand)]
#[command(after_help = "Examples:\n  \
        trellis token new --name ci-team-a --namespace team-a\n  \
        trellis token new --name services --namespace '*'   # the services' own token\n  \
        printf %s \"$TOKEN\" | trellis token hash")]
pub enum TokenCommand {
    /// Make a new random token; prints it once and its line for the access file's `tokens`.
    New(NewArgs),
    /// Print the SHA-256 the access file holds for a token read from standard input.
    Hash,
}

/// Arguments of `trellis token new`.
#[derive(Debug, Args)]
pub struct NewArgs {
    /// A name for the token, shown in the services' logs instead of the token.
    #[arg(long)]
    pub name: String,
    /// The namespace the token acts in, or `*` for every namespace (the services' own token).
    #[arg(long)]
    pub namespace: String,
}

/// Runs a `trellis token` command.
pub fn run(command: TokenCommand) -> ExitCode {
    exit(match command {
        TokenCommand::New(args) => new(&args),
        TokenCommand::Hash => hash(),
    })
}

fn new(args: &NewArgs) -> Result<(), Failure> {
    if args.name.trim().is_empty() {
        return Err(Failure::bad_input("--name: must not be empty"));
    }
    if args.namespace != access::ALL_NAMESPACES {
        access::check_namespace_name(&args.namespace)
            .map_err(|why| Failure::bad_input(format!("--namespace: {why}")))?;
    }
    let token = access::new_token();
    let digest = access::token_digest(&token);
    let namespace = if args.namespace == access::ALL_NAMESPACES {
        "\"*\"".to_owned()
    } else {
        args.namespace.clone()
    };
    let mut out = io::stdout().lock();
    writeln!(out, "{token}")?;
    eprintln!(
        "trellis: the token is printed once, above; keep it in a secret store. Add this line under \
         `tokens:` in the access file:"
    );
    eprintln!(
        "  - {{name: {}, namespace: {namespace}, sha256: {digest}}}",
        args.name
    );
    Ok(())
}

fn hash() -> Result<(), Failure> {
    let mut line = String::new();
    io::stdin().lock().read_line(&mut line)?;
    let token = line.trim();
    if token.is_empty() {
        return Err(Failure::bad_input(
            "no token on standard input: `printf %s \"$TOKEN\" | trellis token hash`",
        ));
    }
    writeln!(io::stdout().lock(), "{}", access::token_digest(token))?;
    Ok(())
}
