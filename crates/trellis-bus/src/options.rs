//! How a service reaches NATS: the server list, authentication (user and password, token, NKey
//! seed, or a `.creds` file), TLS (a CA, a client certificate, TLS required), and the replicas of
//! the streams and buckets it creates. Secrets are held as [`Secret`] and URLs are shown with
//! [`trellis_telemetry::redact::url`], so neither reaches a log line.

use std::path::PathBuf;
use std::time::Duration;

use trellis_telemetry::redact::{self, Secret};

use crate::Error;

/// The NATS flags every service binary takes.
#[derive(Clone, Debug, clap::Args)]
#[group(id = "nats")]
#[command(next_help_heading = "NATS")]
pub struct NatsArgs {
    /// NATS server(s) with JetStream: `nats://host:4222`, `tls://host:4222`, or a
    /// comma-separated list of a cluster's servers.
    #[arg(
        long,
        env = "TRELLIS_NATS_URL",
        default_value = "nats://127.0.0.1:4222",
        value_name = "URL"
    )]
    pub nats_url: String,
    /// User name for NATS user/password authentication (with --nats-password).
    #[arg(long, env = "TRELLIS_NATS_USER", requires = "nats_password")]
    pub nats_user: Option<String>,
    /// Password of --nats-user.
    #[arg(
        long,
        env = "TRELLIS_NATS_PASSWORD",
        hide_env_values = true,
        requires = "nats_user"
    )]
    pub nats_password: Option<Secret>,
    /// Token for NATS token authentication.
    #[arg(long, env = "TRELLIS_NATS_TOKEN", hide_env_values = true)]
    pub nats_token: Option<Secret>,
    /// A NATS `.creds` file (user JWT and NKey seed), for decentralized authentication.
    #[arg(long, env = "TRELLIS_NATS_CREDS", value_name = "FILE")]
    pub nats_creds: Option<PathBuf>,
    /// A file holding an NKey seed (`SU...`), for NKey authentication.
    #[arg(long, env = "TRELLIS_NATS_NKEY_FILE", value_name = "FILE")]
    pub nats_nkey_file: Option<PathBuf>,
    /// PEM CA certificate(s) trusted for the NATS server's TLS.
    #[arg(long, env = "TRELLIS_NATS_TLS_CA", value_name = "FILE")]
    pub nats_tls_ca: Option<PathBuf>,
    /// PEM client certificate for NATS servers that verify clients (with --nats-tls-key).
    #[arg(
        long,
        env = "TRELLIS_NATS_TLS_CERT",
        value_name = "FILE",
        requires = "nats_tls_key"
    )]
    pub nats_tls_cert: Option<PathBuf>,
    /// PEM private key of --nats-tls-cert.
    #[arg(
        long,
        env = "TRELLIS_NATS_TLS_KEY",
        value_name = "FILE",
        requires = "nats_tls_cert"
    )]
    pub nats_tls_key: Option<PathBuf>,
    /// Refuse to talk to NATS without TLS.
    #[arg(long, env = "TRELLIS_NATS_TLS_REQUIRED")]
    pub nats_tls_required: bool,
    /// Replicas of the streams and key-value buckets this service creates (3 on a 3-node
    /// JetStream cluster).
    #[arg(long, env = "TRELLIS_NATS_REPLICAS", default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=5))]
    pub nats_replicas: u8,
}

impl NatsArgs {
    /// The options the flags describe; an error names conflicting flags.
    pub fn options(&self) -> Result<NatsOptions, Error> {
        let mut methods = Vec::new();
        let auth = {
            let mut auth = NatsAuth::None;
            if let (Some(user), Some(password)) = (&self.nats_user, &self.nats_password) {
                methods.push("--nats-user");
                auth = NatsAuth::UserPassword {
                    user: user.clone(),
                    password: password.clone(),
                };
            }
            if let Some(token) = &self.nats_token {
                methods.push("--nats-token");
                auth = NatsAuth::Token(token.clone());
            }
            if let Some(path) = &self.nats_creds {
                methods.push("--nats-creds");
                auth = NatsAuth::Creds(path.clone());
            }
            if let Some(path) = &self.nats_nkey_file {
                methods.push("--nats-nkey-file");
                auth = NatsAuth::NKeyFile(path.clone());
            }
            auth
        };
        if methods.len() > 1 {
            return Err(Error::Options(format!(
                "{} each choose a way to authenticate to NATS: give one",
                methods.join(" and ")
            )));
        }
        Ok(NatsOptions {
            url: self.nats_url.clone(),
            auth,
            tls: NatsTls {
                ca: self.nats_tls_ca.clone(),
                client_cert: self.nats_tls_cert.clone().zip(self.nats_tls_key.clone()),
                required: self.nats_tls_required,
            },
            replicas: usize::from(self.nats_replicas),
        })
    }
}

/// How to reach NATS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NatsOptions {
    /// One URL or a comma-separated list; may hold credentials (never logged).
    pub url: String,
    pub auth: NatsAuth,
    pub tls: NatsTls,
    /// Replicas of the streams and buckets created.
    pub replicas: usize,
}

impl Default for NatsOptions {
    fn default() -> Self {
        Self::new("nats://127.0.0.1:4222")
    }
}

/// How to authenticate to NATS.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum NatsAuth {
    /// No credentials (or those in the URL).
    #[default]
    None,
    UserPassword {
        user: String,
        password: Secret,
    },
    Token(Secret),
    /// A `.creds` file.
    Creds(PathBuf),
    /// A file holding an NKey seed.
    NKeyFile(PathBuf),
}

/// TLS towards NATS.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NatsTls {
    pub ca: Option<PathBuf>,
    /// Certificate and key presented to the server.
    pub client_cert: Option<(PathBuf, PathBuf)>,
    pub required: bool,
}

impl NatsOptions {
    /// The server at `url`, no credentials, no TLS settings, one replica.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            auth: NatsAuth::None,
            tls: NatsTls::default(),
            replicas: 1,
        }
    }

    /// The URL as logs may show it.
    pub fn shown_url(&self) -> String {
        redact::url(&self.url)
    }

    /// Builds the client options; fails for unreadable credential files.
    pub(crate) async fn connect_options(
        &self,
        name: &str,
    ) -> Result<async_nats::ConnectOptions, Error> {
        let mut options = async_nats::ConnectOptions::new();
        match &self.auth {
            // The client takes no credentials from the URL by itself: `nats://user:pw@host`
            // and `nats://token@host` are honoured here.
            NatsAuth::None => match url_credentials(&self.url) {
                Some((user, Some(password))) => {
                    options = options.user_and_password(user, password);
                }
                Some((token, None)) => options = options.token(token),
                None => {}
            },
            NatsAuth::UserPassword { user, password } => {
                options = options.user_and_password(user.clone(), password.expose().to_owned());
            }
            NatsAuth::Token(token) => options = options.token(token.expose().to_owned()),
            NatsAuth::Creds(path) => {
                options = options.credentials_file(path).await.map_err(|err| {
                    Error::Options(format!(
                        "cannot read the NATS credentials file {}: {err}",
                        path.display()
                    ))
                })?;
            }
            NatsAuth::NKeyFile(path) => {
                let seed = std::fs::read_to_string(path).map_err(|err| {
                    Error::Options(format!(
                        "cannot read the NKey seed file {}: {err}",
                        path.display()
                    ))
                })?;
                let seed = seed.trim();
                if !seed.starts_with('S') {
                    return Err(Error::Options(format!(
                        "{}: not an NKey seed (a seed starts with `S`, e.g. `SU...`)",
                        path.display()
                    )));
                }
                options = options.nkey(seed.to_owned());
            }
        }
        for path in self
            .tls
            .ca
            .iter()
            .chain(self.tls.client_cert.iter().flat_map(|(c, k)| [c, k]))
        {
            if let Err(err) = std::fs::metadata(path) {
                return Err(Error::Options(format!(
                    "cannot read {} for NATS TLS: {err}",
                    path.display()
                )));
            }
        }
        if let Some(ca) = &self.tls.ca {
            options = options.add_root_certificates(ca.clone());
        }
        if let Some((cert, key)) = &self.tls.client_cert {
            options = options.add_client_certificate(cert.clone(), key.clone());
        }
        if self.tls.required || self.tls.ca.is_some() || self.tls.client_cert.is_some() {
            options = options.require_tls(true);
        }
        Ok(options
            .name(name)
            .connection_timeout(Duration::from_secs(5))
            .client_capacity(8192)
            .subscription_capacity(65_536))
    }
}

/// Returns `urls` without the credentials of their authorities: they are passed to the client as
/// options instead, since the client writes the URLs it is given into its debug log.
pub(crate) fn without_credentials(urls: &str) -> String {
    urls.split(',')
        .map(|url| {
            let url = url.trim();
            let (scheme, rest) = match url.find("://") {
                Some(at) => url.split_at(at + 3),
                None => ("", url),
            };
            let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
            match rest[..end].rfind('@') {
                Some(at) => format!("{scheme}{}", &rest[at + 1..]),
                None => url.to_owned(),
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// The credentials of the first URL of `urls`: `(user, Some(password))`, `(token, None)`, or
/// none; percent-escapes decoded.
fn url_credentials(urls: &str) -> Option<(String, Option<String>)> {
    let first = urls.split(',').next()?.trim();
    let addr: async_nats::ServerAddr = first.parse().ok()?;
    let user = percent_decode(addr.username()?);
    Some((user, addr.password().map(percent_decode)))
}

/// Decodes `%XX` escapes; malformed ones are kept as written.
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = (bytes[i] == b'%')
            .then(|| text.get(i + 1..i + 3))
            .flatten()
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match escaped {
            Some(byte) => {
                decoded.push(byte);
                i += 3;
            }
            None => {
                decoded.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&decoded).into_owned()
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        nats: NatsArgs,
    }

    fn options(args: &[&str]) -> Result<NatsOptions, String> {
        let cli = Cli::try_parse_from(std::iter::once("test").chain(args.iter().copied()))
            .map_err(|e| e.to_string())?;
        cli.nats.options().map_err(|e| e.to_string())
    }

    #[test]
    fn one_way_to_authenticate() {
        let opts = options(&["--nats-user", "u", "--nats-password", "pw"]).expect("valid");
        assert_eq!(
            opts.auth,
            NatsAuth::UserPassword {
                user: "u".to_owned(),
                password: Secret::new("pw")
            }
        );
        let err =
            options(&["--nats-token", "t", "--nats-creds", "/x.creds"]).expect_err("two ways");
        assert_eq!(
            err,
            "--nats-token and --nats-creds each choose a way to authenticate to NATS: give one"
        );
        assert!(
            options(&["--nats-user", "u"]).is_err(),
            "a user needs a password"
        );
        assert!(options(&["--nats-replicas", "0"]).is_err());
        assert_eq!(
            options(&["--nats-replicas", "3"]).expect("valid").replicas,
            3
        );
    }

    #[test]
    fn credentials_in_urls_are_read_and_decoded() {
        assert_eq!(
            url_credentials("nats://u:p%40ss@h:4222,nats://x:y@h2:4222"),
            Some(("u".to_owned(), Some("p@ss".to_owned())))
        );
        assert_eq!(
            url_credentials("nats://s3cret@h:4222"),
            Some(("s3cret".to_owned(), None))
        );
        assert_eq!(url_credentials("nats://h:4222"), None);
        assert_eq!(percent_decode("a%2"), "a%2");
        assert_eq!(
            without_credentials("nats://u:p@h:4222,tls://t@h2:4222/x"),
            "nats://h:4222,tls://h2:4222/x"
        );
        assert_eq!(without_credentials("nats://h:4222"), "nats://h:4222");
    }

    #[test]
    fn debug_output_hides_secrets() {
        let opts = options(&[
            "--nats-url",
            "nats://u:urlpw@h:4222",
            "--nats-user",
            "u",
            "--nats-password",
            "flagpw",
        ])
        .expect("valid");
        let shown = format!("{opts:?} {}", opts.shown_url());
        assert!(!shown.contains("flagpw"), "{shown}");
        assert_eq!(opts.shown_url(), "nats://u:[redacted]@h:4222");
    }
}
