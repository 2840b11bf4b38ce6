//! Secrets never reach a log line: [`Secret`] holds a token or password and prints as
//! `[redacted]` whichever way it is formatted, and [`url`] removes the password (or token) from
//! a URL before it is shown.

use std::fmt;
use std::sync::Arc;

/// A secret value: a bearer token, a password, an NKey seed. Only [`Secret::expose`] gives the
/// value; `Debug` and `Display` print `[redacted]`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Arc<str>);

impl Secret {
    /// Wraps `value`.
    pub fn new(value: impl Into<Arc<str>>) -> Self {
        Self(value.into())
    }

    /// Returns the value, to send it where it belongs (never to a log).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

impl std::str::FromStr for Secret {
    type Err = std::convert::Infallible;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Self::new(s))
    }
}

/// Returns `url` with the credentials of its authority hidden: `nats://user:pw@host:4222` becomes
/// `nats://user:[redacted]@host:4222`, `nats://token@host` becomes `nats://[redacted]@host`. Lists
/// of URLs (comma-separated, as NATS takes them) are handled one by one.
pub fn url(url: &str) -> String {
    url.split(',').map(one_url).collect::<Vec<_>>().join(",")
}

fn one_url(url: &str) -> String {
    let (scheme, rest) = match url.find("://") {
        Some(at) => url.split_at(at + 3),
        None => ("", url),
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let Some(at) = authority.rfind('@') else {
        return url.to_owned();
    };
    let (userinfo, host) = authority.split_at(at);
    let shown = match userinfo.split_once(':') {
        Some((user, _password)) => format!("{user}:[redacted]"),
        None => "[redacted]".to_owned(),
    };
    format!("{scheme}{shown}{host}{tail}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_print_redacted_every_way() {
        let secret = Secret::new("s3cr3t-token");
        assert_eq!(format!("{secret}"), "[redacted]");
        assert_eq!(format!("{secret:?}"), "[redacted]");
        assert_eq!(format!("{:?}", Some(&secret)), "Some([redacted])");
        assert_eq!(secret.expose(), "s3cr3t-token");
    }

    #[test]
    fn urls_lose_their_credentials_only() {
        for (given, shown) in [
            ("nats://127.0.0.1:4222", "nats://127.0.0.1:4222"),
            (
                "nats://alice:pw@nats:4222",
                "nats://alice:[redacted]@nats:4222",
            ),
            ("nats://tok@nats:4222", "nats://[redacted]@nats:4222"),
            (
                "postgres://u:p@db:5432/x?sslmode=require",
                "postgres://u:[redacted]@db:5432/x?sslmode=require",
            ),
            (
                "nats://a:b@n1:4222,nats://a:b@n2:4222",
                "nats://a:[redacted]@n1:4222,nats://a:[redacted]@n2:4222",
            ),
            (
                "sqlite://trellis.db?mode=rwc",
                "sqlite://trellis.db?mode=rwc",
            ),
            ("http://h/path@x", "http://h/path@x"),
        ] {
            assert_eq!(url(given), shown, "{given}");
        }
    }
}
