//! The access file: namespaces with their quotas, the bearer tokens that act in them, and the
//! deployment's size limits. Operators write it (YAML) and hand it to every gRPC server with
//! `--access-file`; without one, calls need no token, every execution is in namespace `default`
//! and nothing is limited beyond the built-in defaults.
//!
//! ```yaml
//! namespaces:
//!   team-a: {tier: teams}
//!   team-b: {tier: writer_pro, max_concurrency: 2, failure_actions: [retry, skip]}
//! tokens:
//!   - {name: ci-team-a, namespace: team-a, sha256: "<hex SHA-256 of the token>"}
//!   - {name: services, namespace: "*", sha256: "<hex>"}
//! limits: {max_plan_bytes: 16777216, max_tasks: 100000, max_payload_bytes: 1048576}
//! ```
//!
//! Only SHA-256 digests of tokens are kept, so the file reveals no token; a presented token is
//! hashed and looked up. A token of namespace `"*"` acts in every namespace: the services' own
//! token and operators'.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;
use sha2::{Digest as _, Sha256};
use trellis_core::quota::{ActionKind, ActionSet, Quota, Tier};

/// The namespace of executions started without one, and of every execution when there is no
/// access file.
pub const DEFAULT_NAMESPACE: &str = "default";

/// The namespace of a token that acts in every namespace.
pub const ALL_NAMESPACES: &str = "*";

/// Where a caller may act.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Scope {
    /// Every namespace: no access file (authentication off), or a `"*"` token.
    All,
    /// One namespace.
    Namespace(Arc<str>),
}

impl Scope {
    /// Returns whether a caller with this scope may see and control an execution of `namespace`.
    pub fn allows(&self, namespace: &str) -> bool {
        match self {
            Self::All => true,
            Self::Namespace(own) => **own == *namespace,
        }
    }
}

/// Who is calling, as the server's authentication established it; put in each request's
/// extensions for the handlers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    /// The token's name from the access file (`anonymous` without authentication), for logs.
    pub name: Arc<str>,
    pub scope: Scope,
}

impl Principal {
    /// The caller when authentication is off.
    pub fn anonymous() -> Self {
        Self {
            name: Arc::from("anonymous"),
            scope: Scope::All,
        }
    }

    /// Returns the namespace a new execution runs in: the one asked for, or the caller's own, or
    /// `default`; an error when the caller may not act there.
    pub fn namespace_for(&self, asked: &str) -> Result<Arc<str>, String> {
        match (&self.scope, asked) {
            (Scope::All, "") => Ok(Arc::from(DEFAULT_NAMESPACE)),
            (Scope::All, asked) => Ok(Arc::from(asked)),
            (Scope::Namespace(own), "") => Ok(own.clone()),
            (Scope::Namespace(own), asked) if **own == *asked => Ok(own.clone()),
            (Scope::Namespace(own), asked) => Err(format!(
                "the token {:?} acts in namespace {own:?}, not {asked:?}",
                self.name
            )),
        }
    }
}

/// Size limits of a deployment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest plan text (or compiled plan) accepted.
    pub max_plan_bytes: usize,
    /// Most tasks a plan may have.
    pub max_tasks: usize,
    /// Largest task input, task output, step state or answer, in bytes.
    pub max_payload_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        let plan = trellis_core::plan::Limits::default();
        Self {
            max_plan_bytes: plan.max_input_bytes,
            max_tasks: plan.max_tasks,
            // A task's output travels in one NATS message of at most 8 MiB, next to its ids.
            max_payload_bytes: 4 * 1024 * 1024,
        }
    }
}

impl Limits {
    /// The plan compiler's limits these set.
    pub fn plan(&self) -> trellis_core::plan::Limits {
        trellis_core::plan::Limits {
            max_input_bytes: self.max_plan_bytes,
            max_tasks: self.max_tasks,
            ..trellis_core::plan::Limits::default()
        }
    }
}

/// A loaded access file.
#[derive(Clone)]
pub struct AccessPolicy {
    namespaces: HashMap<String, Quota>,
    tokens: HashMap<[u8; 32], Principal>,
    limits: Limits,
}

impl fmt::Debug for AccessPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AccessPolicy")
            .field("namespaces", &self.namespaces.keys().collect::<Vec<_>>())
            .field("tokens", &self.tokens.len())
            .field("limits", &self.limits)
            .finish()
    }
}

/// Why an access file was refused; names the file and, where it can, the line.
#[derive(Debug, thiserror::Error)]
#[error("{source_name}: {message}")]
pub struct AccessError {
    pub source_name: String,
    pub message: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AccessFile {
    namespaces: BTreeMap<String, NamespaceSpec>,
    #[serde(default)]
    tokens: Vec<TokenSpec>,
    #[serde(default)]
    limits: LimitsSpec,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NamespaceSpec {
    tier: Option<Tier>,
    max_concurrency: Option<Concurrency>,
    failure_actions: Option<Vec<ActionKind>>,
    checkpoints: Option<bool>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Concurrency {
    Limit(u32),
    Word(String),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenSpec {
    name: String,
    namespace: String,
    sha256: String,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitsSpec {
    max_plan_bytes: Option<usize>,
    max_tasks: Option<usize>,
    max_payload_bytes: Option<usize>,
}

impl AccessPolicy {
    /// Reads and checks the access file at `path`.
    pub fn load(path: &Path) -> Result<Self, AccessError> {
        let text = std::fs::read_to_string(path).map_err(|err| AccessError {
            source_name: path.display().to_string(),
            message: format!("cannot read the access file: {err}"),
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parses and checks access-file text; `source_name` names it in errors.
    pub fn parse(text: &str, source_name: &str) -> Result<Self, AccessError> {
        let fail = |message: String| AccessError {
            source_name: source_name.to_owned(),
            message,
        };
        let file: AccessFile =
            serde_yaml_ng::from_str(text).map_err(|err| fail(err.to_string()))?;
        let mut namespaces = HashMap::new();
        for (name, spec) in file.namespaces {
            check_namespace_name(&name).map_err(|why| fail(format!("namespaces.{name}: {why}")))?;
            let mut quota = spec.tier.map_or(Quota::UNLIMITED, Tier::quota);
            match spec.max_concurrency {
                None => {}
                Some(Concurrency::Limit(0)) => {
                    return Err(fail(format!(
                        "namespaces.{name}.max_concurrency: must be at least 1 (or `unlimited`)"
                    )));
                }
                Some(Concurrency::Limit(n)) => quota.max_concurrency = Some(n),
                Some(Concurrency::Word(word)) if word == "unlimited" => {
                    quota.max_concurrency = None;
                }
                Some(Concurrency::Word(word)) => {
                    return Err(fail(format!(
                        "namespaces.{name}.max_concurrency: {word:?} is neither a number nor `unlimited`"
                    )));
                }
            }
            if let Some(actions) = spec.failure_actions {
                quota.failure_actions = ActionSet::of(actions);
            }
            if let Some(checkpoints) = spec.checkpoints {
                quota.checkpoints = checkpoints;
            }
            namespaces.insert(name, quota);
        }
        let mut tokens = HashMap::new();
        let mut names = HashMap::new();
        for (i, token) in file.tokens.into_iter().enumerate() {
            let at = format!("tokens[{i}] ({})", token.name);
            if token.name.is_empty() {
                return Err(fail(format!("tokens[{i}].name: must not be empty")));
            }
            if let Some(earlier) = names.insert(token.name.clone(), i) {
                return Err(fail(format!(
                    "{at}.name: tokens[{earlier}] has the same name; names must be unique"
                )));
            }
            let scope = if token.namespace == ALL_NAMESPACES {
                Scope::All
            } else if namespaces.contains_key(&token.namespace) {
                Scope::Namespace(Arc::from(token.namespace.as_str()))
            } else {
                return Err(fail(format!(
                    "{at}.namespace: no namespace {:?} (declare it under `namespaces`, or use \"*\" for every namespace)",
                    token.namespace
                )));
            };
            let digest =
                parse_digest(&token.sha256).map_err(|why| fail(format!("{at}.sha256: {why}")))?;
            let principal = Principal {
                name: Arc::from(token.name.as_str()),
                scope,
            };
            if let Some(other) = tokens.insert(digest, principal) {
                return Err(fail(format!(
                    "{at}.sha256: the same token as {:?}; every token must be different",
                    other.name
                )));
            }
        }
        let defaults = Limits::default();
        let limits = Limits {
            max_plan_bytes: file
                .limits
                .max_plan_bytes
                .unwrap_or(defaults.max_plan_bytes),
            max_tasks: file.limits.max_tasks.unwrap_or(defaults.max_tasks),
            max_payload_bytes: file
                .limits
                .max_payload_bytes
                .unwrap_or(defaults.max_payload_bytes),
        };
        for (field, value) in [
            ("max_plan_bytes", limits.max_plan_bytes),
            ("max_tasks", limits.max_tasks),
            ("max_payload_bytes", limits.max_payload_bytes),
        ] {
            if value == 0 {
                return Err(fail(format!("limits.{field}: must be at least 1")));
            }
        }
        Ok(Self {
            namespaces,
            tokens,
            limits,
        })
    }

    /// Returns who presents `token`, if anyone may.
    pub fn authenticate(&self, token: &str) -> Option<&Principal> {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        self.tokens.get(&digest)
    }

    /// Returns the quota of `namespace`; `None` when the file does not declare it.
    pub fn quota(&self, namespace: &str) -> Option<&Quota> {
        self.namespaces.get(namespace)
    }

    /// Returns the deployment's size limits.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Returns the declared namespaces, sorted.
    pub fn namespaces(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.namespaces.keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }
}

/// Returns the lowercase hex SHA-256 of `token`, as the access file holds it.
pub fn token_digest(token: &str) -> String {
    Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Returns a new random token: 32 bytes of the operating system's randomness (two UUIDv4s),
/// hex, prefixed `trellis_` so it is recognisable in a secret store.
pub fn new_token() -> String {
    let mut token = String::from("trellis_");
    for _ in 0..2 {
        token.push_str(&uuid::Uuid::new_v4().simple().to_string());
    }
    token
}

fn parse_digest(text: &str) -> Result<[u8; 32], String> {
    let text = text.trim();
    if text.len() != 64 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!(
            "{text:?} is not a SHA-256 digest (64 hex digits; `trellis token new` prints one)"
        ));
    }
    let mut digest = [0u8; 32];
    for (i, byte) in digest.iter_mut().enumerate() {
        // Two ASCII hex digits, checked above.
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).map_err(|e| e.to_string())?;
    }
    Ok(digest)
}

/// Namespace names: 1 to 63 of `a-z`, `0-9`, `-`, starting with a letter or digit (a DNS label,
/// so they can name Kubernetes objects too).
pub fn check_namespace_name(name: &str) -> Result<(), String> {
    let valid = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if valid {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a namespace name: 1 to 63 of a-z, 0-9 and `-`, not starting or ending with `-`"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(text: &str) -> Result<AccessPolicy, String> {
        AccessPolicy::parse(text, "access.yaml").map_err(|e| e.to_string())
    }

    #[test]
    fn tokens_resolve_to_their_namespace_and_quotas_to_their_tier() {
        let text = format!(
            "namespaces:\n  team-a: {{tier: teams}}\n  team-b: {{tier: writer_pro, max_concurrency: 2, failure_actions: [retry, skip]}}\n\
             tokens:\n  - {{name: a, namespace: team-a, sha256: {}}}\n  - {{name: ops, namespace: \"*\", sha256: {}}}\n\
             limits: {{max_tasks: 50}}\n",
            token_digest("token-a"),
            token_digest("token-ops"),
        );
        let policy = policy(&text).expect("a valid file");
        let a = policy.authenticate("token-a").expect("token-a is known");
        assert_eq!(a.scope, Scope::Namespace(Arc::from("team-a")));
        assert_eq!(
            policy.authenticate("token-ops").map(|p| &p.scope),
            Some(&Scope::All)
        );
        assert!(policy.authenticate("token-x").is_none());
        assert!(policy.authenticate("").is_none());
        let b = policy.quota("team-b").expect("team-b is declared");
        assert_eq!(b.max_concurrency, Some(2));
        assert_eq!(b.failure_actions.to_string(), "retry, skip");
        assert!(b.checkpoints);
        assert_eq!(policy.quota("team-a"), Some(&Tier::Teams.quota()));
        assert_eq!(policy.limits().max_tasks, 50);
        assert_eq!(
            policy.limits().max_plan_bytes,
            Limits::default().max_plan_bytes
        );
    }

    #[test]
    fn mistakes_are_named_with_their_place() {
        let digest = token_digest("t");
        for (text, expected) in [
            (
                "namespaces: {}\ntokens: [{name: x, namespace: nope, sha256: aa}]\n".to_owned(),
                "tokens[0] (x).namespace: no namespace \"nope\"",
            ),
            (
                format!(
                    "namespaces: {{a: {{}}}}\ntokens: [{{name: x, namespace: a, sha256: {}}}]\n",
                    "zz"
                ),
                "tokens[0] (x).sha256: \"zz\" is not a SHA-256 digest",
            ),
            (
                format!(
                    "namespaces: {{a: {{}}}}\ntokens: [{{name: x, namespace: a, sha256: {digest}}}, {{name: y, namespace: a, sha256: {digest}}}]\n"
                ),
                "tokens[1] (y).sha256: the same token as \"x\"",
            ),
            (
                "namespaces: {Team: {}}\n".to_owned(),
                "namespaces.Team: \"Team\" is not a namespace name",
            ),
            (
                "namespaces: {a: {max_concurrency: 0}}\n".to_owned(),
                "namespaces.a.max_concurrency: must be at least 1",
            ),
            (
                "namespaces: {a: {max_concurrency: lots}}\n".to_owned(),
                "\"lots\" is neither a number nor `unlimited`",
            ),
            (
                "namespaces: {a: {tier: gold}}\n".to_owned(),
                "unknown variant `gold`",
            ),
            (
                "namespaces: {a: {tiers: core}}\n".to_owned(),
                "unknown field `tiers`",
            ),
            (
                "namespaces: {}\nlimits: {max_tasks: 0}\n".to_owned(),
                "limits.max_tasks: must be at least 1",
            ),
        ] {
            let err = policy(&text).expect_err(&text);
            assert!(err.starts_with("access.yaml: "), "{err}");
            assert!(err.contains(expected), "{err}\nexpected: {expected}");
        }
    }

    #[test]
    fn namespace_for_keeps_callers_in_their_namespace() {
        let a = Principal {
            name: Arc::from("a"),
            scope: Scope::Namespace(Arc::from("team-a")),
        };
        assert_eq!(a.namespace_for("").as_deref(), Ok("team-a"));
        assert_eq!(a.namespace_for("team-a").as_deref(), Ok("team-a"));
        assert!(a.namespace_for("team-b").is_err());
        let all = Principal::anonymous();
        assert_eq!(all.namespace_for("").as_deref(), Ok("default"));
        assert_eq!(all.namespace_for("team-b").as_deref(), Ok("team-b"));
    }

    #[test]
    fn new_tokens_differ_and_hash_to_what_the_file_holds() {
        let (one, two) = (new_token(), new_token());
        assert_ne!(one, two);
        assert!(one.starts_with("trellis_") && one.len() == 8 + 64, "{one}");
        assert_eq!(
            token_digest("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert!(parse_digest(&token_digest(&one)).is_ok());
    }
}
