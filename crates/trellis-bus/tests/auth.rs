//! Connecting to NATS servers that authenticate their clients and speak TLS: the right
//! credentials get a working JetStream connection; wrong or missing ones are refused at once
//! with an error that names the flags to check and never holds the secret.

use std::time::Duration;

use trellis_bus::{Error, NatsAuth, NatsOptions, NatsTls};
use trellis_telemetry::redact::Secret;
use trellis_testkit::{NatsServer, TestPki};

/// Refusals come at once: waiting cannot fix credentials.
const REFUSED_WITHIN: Duration = Duration::from_secs(10);

fn with_auth(nats: &NatsServer, auth: NatsAuth) -> NatsOptions {
    NatsOptions {
        auth,
        ..NatsOptions::new(nats.url())
    }
}

/// Connects and creates the streams, proving JetStream works for the authenticated client.
async fn works(options: &NatsOptions) -> anyhow::Result<()> {
    let client = trellis_bus::connect_with(options, "auth-test").await?;
    let js = async_nats::jetstream::new(client);
    trellis_bus::ensure_streams(&js, 1).await?;
    Ok(())
}

/// Connects expecting a refusal; returns its message.
async fn refused(options: &NatsOptions) -> String {
    match tokio::time::timeout(
        REFUSED_WITHIN,
        trellis_bus::connect_with(options, "auth-test"),
    )
    .await
    {
        Ok(Ok(_)) => panic!("connected with {options:?}"),
        Ok(Err(err)) => err.to_string(),
        Err(_) => panic!("no refusal within {REFUSED_WITHIN:?} for {options:?}: it kept retrying"),
    }
}

#[tokio::test]
async fn user_and_password_are_checked_and_never_shown() -> anyhow::Result<()> {
    let nats =
        NatsServer::start_with_config("authorization { user: trellis, password: \"pw-7f3a91\" }")?;
    let user = |password: &str| {
        with_auth(
            &nats,
            NatsAuth::UserPassword {
                user: "trellis".to_owned(),
                password: Secret::new(password),
            },
        )
    };
    works(&user("pw-7f3a91")).await?;
    for options in [user("pw-wrong-0000"), NatsOptions::new(nats.url())] {
        let message = refused(&options).await;
        assert!(message.contains("refused the credentials"), "{message}");
        assert!(message.contains("--nats-password"), "{message}");
        assert!(
            !message.contains("pw-"),
            "the error shows a password: {message}"
        );
    }
    // Credentials in the URL work too, and are hidden wherever the URL is shown.
    let port = nats.port();
    let in_url = NatsOptions::new(format!("nats://trellis:pw-7f3a91@127.0.0.1:{port}"));
    works(&in_url).await?;
    assert_eq!(
        in_url.shown_url(),
        format!("nats://trellis:[redacted]@127.0.0.1:{port}")
    );
    Ok(())
}

#[tokio::test]
async fn a_token_is_checked() -> anyhow::Result<()> {
    let nats = NatsServer::start_with_config("authorization { token: \"tok-51c2e8\" }")?;
    works(&with_auth(
        &nats,
        NatsAuth::Token(Secret::new("tok-51c2e8")),
    ))
    .await?;
    let message = refused(&with_auth(&nats, NatsAuth::Token(Secret::new("tok-nope")))).await;
    assert!(message.contains("refused the credentials"), "{message}");
    assert!(!message.contains("tok-"), "{message}");
    Ok(())
}

#[tokio::test]
async fn an_nkey_seed_file_signs_the_challenge() -> anyhow::Result<()> {
    let user = nkeys::KeyPair::new_user();
    let stranger = nkeys::KeyPair::new_user();
    let nats = NatsServer::start_with_config(&format!(
        "authorization {{ users: [ {{ nkey: {} }} ] }}",
        user.public_key()
    ))?;
    let dir = tempfile::tempdir()?;
    let seed_file = |name: &str, pair: &nkeys::KeyPair| -> anyhow::Result<std::path::PathBuf> {
        let path = dir.path().join(name);
        std::fs::write(&path, pair.seed()?)?;
        Ok(path)
    };
    works(&with_auth(
        &nats,
        NatsAuth::NKeyFile(seed_file("user.nk", &user)?),
    ))
    .await?;
    let message = refused(&with_auth(
        &nats,
        NatsAuth::NKeyFile(seed_file("stranger.nk", &stranger)?),
    ))
    .await;
    assert!(message.contains("refused the credentials"), "{message}");
    // A file that is not a seed is refused before any connection, naming the file.
    let not_a_seed = dir.path().join("public.nk");
    std::fs::write(&not_a_seed, user.public_key())?;
    let message = refused(&with_auth(&nats, NatsAuth::NKeyFile(not_a_seed))).await;
    assert!(message.contains("public.nk: not an NKey seed"), "{message}");
    Ok(())
}

#[tokio::test]
async fn tls_with_a_trusted_ca_and_client_certificates() -> anyhow::Result<()> {
    let pki = TestPki::new()?;
    let (cert, key) = pki.server();
    let nats = NatsServer::start_with_config(&format!(
        "tls {{ cert_file: \"{}\", key_file: \"{}\", ca_file: \"{}\", verify: true, timeout: 2 }}",
        cert.display(),
        key.display(),
        pki.ca().display()
    ))?;
    let tls = |ca: bool, client: Option<(std::path::PathBuf, std::path::PathBuf)>| NatsOptions {
        tls: NatsTls {
            ca: ca.then(|| pki.ca()),
            client_cert: client,
            required: true,
        },
        ..NatsOptions::new(nats.url())
    };
    works(&tls(true, Some(pki.client()))).await?;
    // Without trusting the server's CA, or without a client certificate the server trusts,
    // there is no connection, and the error says to look at the TLS flags.
    for options in [
        tls(false, Some(pki.client())),
        tls(true, None),
        tls(true, Some(pki.stranger())),
    ] {
        let message = refused(&options).await;
        assert!(message.contains("TLS"), "{message}");
    }
    Ok(())
}

#[test]
fn unreadable_credential_files_are_named() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let options = NatsOptions {
        auth: NatsAuth::Creds("/nonexistent/trellis.creds".into()),
        ..NatsOptions::default()
    };
    let err = runtime
        .block_on(trellis_bus::connect_with(&options, "auth-test"))
        .expect_err("no such file");
    assert!(matches!(err, Error::Options(_)), "{err:?}");
    assert!(
        err.to_string().contains("/nonexistent/trellis.creds"),
        "{err}"
    );
}
