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

/// Signs NATS JWT claims (`{"typ":"JWT","alg":"ed25519-nkey"}`) as `issuer`: the subject's
/// public key and name, `nats` for the claims of its kind, and a `jti` hashing the rest.
fn nats_jwt(
    issuer: &nkeys::KeyPair,
    subject: &str,
    nats: serde_json::Value,
) -> anyhow::Result<String> {
    use data_encoding::{BASE32_NOPAD, BASE64URL_NOPAD};
    use sha2::Digest as _;
    let mut claims = serde_json::json!({
        "iat": 1_750_000_000,
        "iss": issuer.public_key(),
        "name": "trellis",
        "sub": subject,
        "nats": nats,
    });
    let digest = sha2::Sha256::digest(serde_json::to_vec(&claims)?);
    claims["jti"] = BASE32_NOPAD.encode(&digest).into();
    let header = BASE64URL_NOPAD.encode(br#"{"typ":"JWT","alg":"ed25519-nkey"}"#);
    let body = BASE64URL_NOPAD.encode(&serde_json::to_vec(&claims)?);
    let signed = format!("{header}.{body}");
    let signature = issuer.sign(signed.as_bytes())?;
    Ok(format!("{signed}.{}", BASE64URL_NOPAD.encode(&signature)))
}

/// An account's claims: no limits but JetStream's, which it needs for the engine's streams.
fn account_claims() -> serde_json::Value {
    serde_json::json!({
        "type": "account",
        "version": 2,
        "limits": {
            "subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1,
            "wildcards": true, "conn": -1, "leaf": -1,
            "mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1,
        },
    })
}

/// A `.creds` file as `nsc` writes it: the user's JWT, then its seed.
fn creds_file(
    dir: &std::path::Path,
    name: &str,
    jwt: &str,
    user: &nkeys::KeyPair,
) -> anyhow::Result<std::path::PathBuf> {
    let path = dir.join(name);
    std::fs::write(
        &path,
        format!(
            "-----BEGIN NATS USER JWT-----\n{jwt}\n------END NATS USER JWT------\n\n\
             ************************* IMPORTANT *************************\n\
             NKEY Seed printed below can be used to sign and prove identity.\n\n\
             -----BEGIN USER NKEY SEED-----\n{}\n------END USER NKEY SEED------\n",
            user.seed()?
        ),
    )?;
    Ok(path)
}

#[tokio::test]
async fn a_creds_file_logs_in_to_an_operator_mode_server() -> anyhow::Result<()> {
    // Decentralized authentication: the server trusts an operator key and knows one account
    // (signed by the operator); users are whoever holds a JWT the account signed and its seed.
    let operator = nkeys::KeyPair::new_operator();
    let account = nkeys::KeyPair::new_account();
    let account_jwt = nats_jwt(&operator, &account.public_key(), account_claims())?;
    // JetStream in operator mode needs a system account (one without JetStream).
    let system = nkeys::KeyPair::new_account();
    let mut system_claims = account_claims();
    if let Some(limits) = system_claims["limits"].as_object_mut() {
        limits.retain(|key, _| {
            !matches!(
                key.as_str(),
                "mem_storage" | "disk_storage" | "streams" | "consumer"
            )
        });
    }
    let system_jwt = nats_jwt(&operator, &system.public_key(), system_claims)?;
    let nats = NatsServer::start_with_config(&format!(
        "trusted_keys: [\"{}\"]\nsystem_account: {}\nresolver: MEMORY\n\
         resolver_preload: {{ {}: \"{account_jwt}\", {}: \"{system_jwt}\" }}",
        operator.public_key(),
        system.public_key(),
        account.public_key(),
        system.public_key(),
    ))?;
    let user_claims = serde_json::json!({
        "type": "user", "version": 2, "subs": -1, "data": -1, "payload": -1,
    });
    let dir = tempfile::tempdir()?;
    let user = nkeys::KeyPair::new_user();
    let user_jwt = nats_jwt(&account, &user.public_key(), user_claims.clone())?;
    works(&with_auth(
        &nats,
        NatsAuth::Creds(creds_file(dir.path(), "user.creds", &user_jwt, &user)?),
    ))
    .await?;

    // A JWT from an account the server does not know, and a known JWT with another user's seed
    // (it cannot sign the server's challenge), are refused.
    let unknown_account = nkeys::KeyPair::new_account();
    let foreign_jwt = nats_jwt(&unknown_account, &user.public_key(), user_claims)?;
    let impostor = nkeys::KeyPair::new_user();
    for creds in [
        creds_file(dir.path(), "foreign.creds", &foreign_jwt, &user)?,
        creds_file(dir.path(), "impostor.creds", &user_jwt, &impostor)?,
    ] {
        let message = refused(&with_auth(&nats, NatsAuth::Creds(creds.clone()))).await;
        assert!(
            message.contains("refused the credentials"),
            "{}: {message}",
            creds.display()
        );
        assert!(!message.contains(&user.seed()?), "a seed in {message}");
    }
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
