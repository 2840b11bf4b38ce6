//! A private certificate authority for TLS tests: a CA, a server certificate for `localhost` and
//! `127.0.0.1`, and a client certificate, written as PEM files into a temporary directory.

use std::path::{Path, PathBuf};

use anyhow::Context;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// PEM files of a test CA and the certificates it signed; removed on drop.
#[derive(Debug)]
pub struct TestPki {
    dir: tempfile::TempDir,
}

impl TestPki {
    /// Makes a CA, a server certificate (for `localhost` and `127.0.0.1`) and a client
    /// certificate signed by it, and a second CA nobody trusts with a client certificate of its
    /// own (for "wrong CA" cases).
    pub fn new() -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("trellis-pki-")
            .tempdir()
            .context("failed to create the certificates' directory")?;
        let ca = new_ca("Trellis test CA")?;
        let other_ca = new_ca("Untrusted test CA")?;
        let write = |name: &str, text: &str| -> anyhow::Result<()> {
            let path = dir.path().join(name);
            std::fs::write(&path, text)
                .with_context(|| format!("failed to write {}", path.display()))
        };
        write("ca.pem", &ca.pem())?;
        write("untrusted-ca.pem", &other_ca.pem())?;
        let server = leaf(
            &ca,
            vec!["localhost".to_owned(), "127.0.0.1".to_owned()],
            ExtendedKeyUsagePurpose::ServerAuth,
        )?;
        write("server.pem", &server.0)?;
        write("server.key", &server.1)?;
        let client = leaf(&ca, vec![], ExtendedKeyUsagePurpose::ClientAuth)?;
        write("client.pem", &client.0)?;
        write("client.key", &client.1)?;
        let stranger = leaf(&other_ca, vec![], ExtendedKeyUsagePurpose::ClientAuth)?;
        write("stranger.pem", &stranger.0)?;
        write("stranger.key", &stranger.1)?;
        Ok(Self { dir })
    }

    /// The directory holding the files.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The CA certificate clients and servers trust.
    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// The certificate of the second CA, which signed nothing the servers present: a client that
    /// trusts only it must refuse every server here.
    pub fn untrusted_ca(&self) -> PathBuf {
        self.dir.path().join("untrusted-ca.pem")
    }

    /// The server's certificate and key.
    pub fn server(&self) -> (PathBuf, PathBuf) {
        (
            self.dir.path().join("server.pem"),
            self.dir.path().join("server.key"),
        )
    }

    /// A client certificate and key signed by [`TestPki::ca`].
    pub fn client(&self) -> (PathBuf, PathBuf) {
        (
            self.dir.path().join("client.pem"),
            self.dir.path().join("client.key"),
        )
    }

    /// A client certificate and key signed by a CA nobody trusts.
    pub fn stranger(&self) -> (PathBuf, PathBuf) {
        (
            self.dir.path().join("stranger.pem"),
            self.dir.path().join("stranger.key"),
        )
    }
}

fn new_ca(name: &str) -> anyhow::Result<CertifiedIssuer<'static, KeyPair>> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    Ok(CertifiedIssuer::self_signed(params, KeyPair::generate()?)?)
}

/// Returns the PEM certificate and key of a leaf signed by `ca`.
fn leaf(
    ca: &CertifiedIssuer<'static, KeyPair>,
    names: Vec<String>,
    usage: ExtendedKeyUsagePurpose,
) -> anyhow::Result<(String, String)> {
    let mut params = CertificateParams::new(names)?;
    params
        .distinguished_name
        .push(DnType::CommonName, "trellis test");
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![usage];
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, ca)?;
    Ok((cert.pem(), key.serialize_pem()))
}
