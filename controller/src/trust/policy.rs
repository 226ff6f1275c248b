//! The trust policy: which image repositories may run, and what their signatures must show.
//!
//! Pure: parsing (with the line of every mistake) and matching a repository to its rule. The
//! file is YAML:
//!
//! ```yaml
//! callers:                    # who may create or change Schedulers; absent: anyone RBAC lets in
//!   groups: [platform]
//! rules:                      # tried in order; the first matching repository decides
//!   - repository: registry.example.com/team-a/**
//!     callers:                # who else may deploy what this rule matches
//!       serviceAccounts: [team-a:ci]
//!     publicKey: |
//!       -----BEGIN PUBLIC KEY-----
//!       ...
//!   - repository: ghcr.io/schedkit/*
//!     keyless:
//!       issuer: https://token.actions.githubusercontent.com
//!       identityRegExp: ^https://github\.com/schedkit/.+$
//!   - repository: registry.example.com/team/**
//!     publicKey: |
//!       -----BEGIN PUBLIC KEY-----
//!       ...
//!   - repository: registry.example.com/dev/*
//!     unsigned: allow
//! ```
//!
//! In a repository pattern `*` stands for any characters within one path component and `**`
//! for any characters across components. Repositories are compared in their full form:
//! `busybox` is `docker.io/library/busybox`.
//!
//! Callers are users, groups and service accounts (`namespace:name` or
//! `system:serviceaccount:namespace:name`) as the API server authenticated them. The callers who
//! may deploy an image are the policy's list and its rule's list together; where neither has one,
//! anyone whom RBAC lets create Schedulers may.

use std::fmt;

use regex::Regex;
use serde::Deserialize;
use serde_saphyr::Spanned;

/// The policy in force when no file is given: sked's own images, signed by the schedkit
/// organisation's GitHub Actions workflows through Sigstore's public-good instance.
pub const DEFAULT_POLICY: &str = r#"rules:
  - repository: ghcr.io/schedkit/**
    keyless:
      issuer: https://token.actions.githubusercontent.com
      identityRegExp: ^https://github\.com/schedkit/[^/]+/\.github/workflows/.+$
"#;

/// OIDC issuer of GitHub Actions tokens.
pub const GITHUB_ACTIONS_ISSUER: &str = "https://token.actions.githubusercontent.com";

/// A parsed, checked policy.
#[derive(Clone, Debug)]
pub struct Policy {
    rules: Vec<Rule>,
    /// Who may deploy any image the rules allow; `None`: anyone RBAC lets in.
    callers: Option<Callers>,
}

/// One rule: a repository pattern and what a signature must show.
#[derive(Clone, Debug)]
pub struct Rule {
    /// The pattern as written.
    pub repository: String,
    pattern: Regex,
    pub requirement: Requirement,
    /// Who else may deploy the images this rule matches.
    pub callers: Option<Callers>,
    /// 1-based line of the rule in the policy file, for messages.
    pub line: u64,
}

/// Who may create or change Schedulers: users, groups and service accounts (kept as the user
/// names the API server gives them, `system:serviceaccount:namespace:name`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Callers {
    pub users: Vec<String>,
    pub groups: Vec<String>,
    pub service_accounts: Vec<String>,
    /// 1-based line of the list in the policy file, for messages.
    pub line: u64,
}

/// Who asks, as the admission request names them.
#[derive(Clone, Copy, Debug)]
pub struct Caller<'a> {
    pub username: &'a str,
    pub groups: &'a [String],
}

/// The service-account user name prefix.
const SERVICE_ACCOUNT_PREFIX: &str = "system:serviceaccount:";

impl Callers {
    pub fn admits(&self, caller: Caller<'_>) -> bool {
        self.users.iter().chain(&self.service_accounts).any(|u| u == caller.username)
            || self.groups.iter().any(|g| caller.groups.contains(g))
    }
}

impl fmt::Display for Callers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if !self.users.is_empty() {
            parts.push(format!("users {}", self.users.join(", ")));
        }
        if !self.groups.is_empty() {
            parts.push(format!("groups {}", self.groups.join(", ")));
        }
        if !self.service_accounts.is_empty() {
            let short: Vec<&str> =
                self.service_accounts.iter().map(|sa| sa.strip_prefix(SERVICE_ACCOUNT_PREFIX).unwrap_or(sa)).collect();
            parts.push(format!("service accounts {}", short.join(", ")));
        }
        write!(f, "{} (line {})", parts.join("; "), self.line)
    }
}

/// Why a caller may not deploy an image. The message names the caller, the lists that applied
/// and how to be allowed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct CallerRefused(pub String);

/// What an image matched by a rule must carry.
#[derive(Clone, Debug)]
pub enum Requirement {
    /// A signature whose certificate chains to the trusted root, issued for this identity by
    /// this OIDC issuer.
    Keyless { issuer: String, identity: Identity },
    /// A signature made with the private half of this key (PEM).
    PublicKey { pem: String },
    /// Nothing: the reference is deployed as written, without contacting the registry.
    Unsigned,
}

/// The certificate identity a keyless signature must carry.
#[derive(Clone, Debug)]
pub enum Identity {
    Exact(String),
    /// Matched against the whole identity (the expression is anchored at both ends).
    Pattern {
        source: String,
        regex: Regex,
    },
}

impl Identity {
    pub fn matches(&self, identity: &str) -> bool {
        match self {
            Identity::Exact(want) => want == identity,
            Identity::Pattern { regex, .. } => regex.is_match(identity),
        }
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Identity::Exact(s) => write!(f, "identity {s:?}"),
            Identity::Pattern { source, .. } => write!(f, "identity matching {source:?}"),
        }
    }
}

/// Why a policy document was refused. The message names the line and the fix.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("trust policy line {line}: {message}")]
pub struct PolicyError {
    pub line: u64,
    pub message: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    /// Required, so that an empty or half-written file is an error rather than a policy that
    /// refuses everything; `rules: []` refuses everything on purpose.
    rules: Vec<Spanned<RawRule>>,
    callers: Option<Spanned<RawCallers>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawCallers {
    #[serde(default)]
    users: Vec<String>,
    #[serde(default)]
    groups: Vec<String>,
    #[serde(default)]
    service_accounts: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawRule {
    repository: Option<String>,
    keyless: Option<RawKeyless>,
    public_key: Option<String>,
    unsigned: Option<String>,
    callers: Option<Spanned<RawCallers>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawKeyless {
    issuer: Option<String>,
    identity: Option<String>,
    identity_reg_exp: Option<String>,
}

impl Policy {
    /// Parses and checks a policy document.
    pub fn parse(text: &str) -> Result<Self, PolicyError> {
        if text.trim().is_empty() {
            return Err(PolicyError {
                line: 1,
                message: "the policy is empty; it needs a `rules:` list (`rules: []` refuses every image)".into(),
            });
        }
        let raw: RawPolicy = serde_saphyr::from_str(text).map_err(|e| yaml_error(&e.to_string()))?;
        let rules = raw.rules.into_iter().map(check_rule).collect::<Result<Vec<_>, _>>()?;
        let callers = raw.callers.map(check_callers).transpose()?;
        Ok(Self { rules, callers })
    }

    /// The built-in default policy.
    pub fn default_policy() -> Self {
        match Self::parse(DEFAULT_POLICY) {
            Ok(policy) => policy,
            // The constant is covered by a unit test; an empty policy refuses everything.
            Err(_) => Self { rules: Vec::new(), callers: None },
        }
    }

    /// The first rule whose pattern matches `repository` (in its full form).
    pub fn rule_for(&self, repository: &str) -> Option<&Rule> {
        let full = full_repository(repository);
        self.rules.iter().find(|r| r.pattern.is_match(&full))
    }

    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// Whether `caller` may create or change a Scheduler that runs an image of `repository`:
    /// the policy's list and the matching rule's list together decide; with neither, anyone
    /// may (RBAC has let them in).
    pub fn check_caller(&self, repository: &str, caller: Caller<'_>) -> Result<(), CallerRefused> {
        let rule = self.rule_for(repository);
        let lists: Vec<&Callers> = self.callers.iter().chain(rule.and_then(|r| r.callers.as_ref())).collect();
        if lists.is_empty() || lists.iter().any(|l| l.admits(caller)) {
            return Ok(());
        }
        let who = match caller.username.strip_prefix(SERVICE_ACCOUNT_PREFIX) {
            Some(sa) => format!("service account {sa}"),
            None => format!("user {:?}", caller.username),
        };
        let groups = if caller.groups.is_empty() { "no groups".to_owned() } else { caller.groups.join(", ") };
        let allowed: Vec<String> = lists
            .iter()
            .map(|l| match rule.filter(|r| r.callers.as_ref() == Some(*l)) {
                Some(r) => format!("for {:?}: {l}", r.repository),
                None => format!("for every image: {l}"),
            })
            .collect();
        Err(CallerRefused(format!(
            "{who} (groups: {groups}) may not create or change Schedulers that run images of {}: the trust policy allows {}; ask for your user, one of your groups or your service account to be added to `callers` in the trust policy",
            full_repository(repository),
            allowed.join(", and ")
        )))
    }
}

fn check_callers(spanned: Spanned<RawCallers>) -> Result<Callers, PolicyError> {
    let line = spanned.referenced.line();
    let raw = spanned.value;
    let err = |message: String| PolicyError { line, message };
    let service_accounts = raw
        .service_accounts
        .iter()
        .map(|sa| {
            let (namespace, name) = sa.strip_prefix(SERVICE_ACCOUNT_PREFIX).unwrap_or(sa).split_once(':').unwrap_or(("", ""));
            if namespace.is_empty() || name.is_empty() || name.contains(':') {
                return Err(err(format!(
                    "`callers.serviceAccounts` entry {sa:?} is not a service account: write namespace:name or system:serviceaccount:namespace:name"
                )));
            }
            Ok(format!("{SERVICE_ACCOUNT_PREFIX}{namespace}:{name}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let blank = raw.users.iter().chain(&raw.groups).any(|u| u.trim().is_empty());
    if blank {
        return Err(err("`callers` has an empty user or group name; remove it or write the name".into()));
    }
    if raw.users.is_empty() && raw.groups.is_empty() && service_accounts.is_empty() {
        return Err(err(
            "`callers` lists no one, which would let no one deploy: name `users`, `groups` or `serviceAccounts`, or remove `callers` to let anyone RBAC allows".into(),
        ));
    }
    Ok(Callers { users: raw.users, groups: raw.groups, service_accounts, line })
}

/// serde-saphyr reports a location as "line N" / "at line N column M" somewhere in its message.
fn yaml_error(message: &str) -> PolicyError {
    let line =
        Regex::new(r"line (\d+)").ok().and_then(|re| re.captures(message).and_then(|c| c[1].parse().ok())).unwrap_or(1);
    PolicyError { line, message: format!("not a valid policy document: {message}") }
}

fn check_rule(spanned: Spanned<RawRule>) -> Result<Rule, PolicyError> {
    let line = spanned.referenced.line();
    let raw = spanned.value;
    let err = |message: String| PolicyError { line, message };
    let repository = raw.repository.filter(|r| !r.trim().is_empty()).ok_or_else(|| {
        err("rule has no `repository`: set the repository pattern it applies to, e.g. ghcr.io/org/*".into())
    })?;
    let pattern = compile_pattern(&repository).map_err(|e| err(format!("repository pattern {repository:?}: {e}")))?;
    let requirement = match (raw.keyless, raw.public_key, raw.unsigned) {
        (Some(k), None, None) => {
            let issuer = k.issuer.filter(|i| !i.is_empty()).ok_or_else(|| {
                err(format!("rule for {repository:?}: `keyless` needs `issuer`, the OIDC issuer URL (e.g. {GITHUB_ACTIONS_ISSUER})"))
            })?;
            let identity = match (k.identity, k.identity_reg_exp) {
                (Some(exact), None) => Identity::Exact(exact),
                (None, Some(source)) => {
                    let regex = Regex::new(&format!("^(?:{source})$"))
                        .map_err(|e| err(format!("rule for {repository:?}: `identityRegExp` does not compile: {e}")))?;
                    Identity::Pattern { source, regex }
                }
                _ => {
                    return Err(err(format!(
                        "rule for {repository:?}: `keyless` needs exactly one of `identity` (exact) or `identityRegExp`"
                    )));
                }
            };
            Requirement::Keyless { issuer, identity }
        }
        (None, Some(pem), None) => {
            if !pem.contains("-----BEGIN PUBLIC KEY-----") {
                return Err(err(format!(
                    "rule for {repository:?}: `publicKey` must be a PEM public key (-----BEGIN PUBLIC KEY-----), as `cosign generate-key-pair` writes to cosign.pub"
                )));
            }
            if let Err(e) = sigstore::crypto::CosignVerificationKey::try_from_pem(pem.as_bytes()) {
                return Err(err(format!("rule for {repository:?}: `publicKey` is not a usable public key: {e}")));
            }
            Requirement::PublicKey { pem }
        }
        (None, None, Some(u)) if u == "allow" => Requirement::Unsigned,
        (None, None, Some(u)) => {
            return Err(err(format!("rule for {repository:?}: `unsigned` accepts only `allow`, not {u:?}")));
        }
        _ => {
            return Err(err(format!(
                "rule for {repository:?} needs exactly one of `keyless`, `publicKey` or `unsigned: allow`"
            )));
        }
    };
    let callers = raw.callers.map(check_callers).transpose()?;
    Ok(Rule { repository, pattern, requirement, callers, line })
}

/// Turns a repository glob into an anchored regular expression.
fn compile_pattern(glob: &str) -> Result<Regex, String> {
    let mut re = String::from("^");
    let mut chars = glob.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '*' {
            if chars.peek() == Some(&'*') {
                chars.next();
                re.push_str(".*");
            } else {
                re.push_str("[^/]*");
            }
        } else if c.is_ascii_alphanumeric() || "./:_-".contains(c) {
            re.push_str(&regex::escape(&c.to_string()));
        } else {
            return Err(format!("character {c:?} is not allowed; use letters, digits, . / : _ - and * or **"));
        }
    }
    re.push('$');
    Regex::new(&re).map_err(|e| e.to_string())
}

/// The repository as a registry names it: `busybox` is `docker.io/library/busybox`.
pub fn full_repository(repository: &str) -> String {
    match repository.split_once('/') {
        Some((host, _)) if host.contains('.') || host.contains(':') || host == "localhost" => repository.to_owned(),
        Some(_) => format!("docker.io/{repository}"),
        None => format!("docker.io/library/{repository}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_policy_requires_schedkit_workflows() {
        let policy = Policy::parse(DEFAULT_POLICY).unwrap();
        let rule = policy.rule_for("ghcr.io/schedkit/scx_rusty").unwrap();
        let Requirement::Keyless { issuer, identity } = &rule.requirement else { panic!("keyless expected") };
        assert_eq!(issuer, GITHUB_ACTIONS_ISSUER);
        assert!(
            identity.matches("https://github.com/schedkit/scx-images/.github/workflows/publish.yml@refs/heads/main")
        );
        assert!(!identity.matches("https://github.com/evil/scx/.github/workflows/publish.yml@refs/heads/main"));
        assert!(policy.rule_for("ghcr.io/other/scx_rusty").is_none());
        assert!(policy.rule_for("docker.io/library/busybox").is_none());
    }

    #[test]
    fn first_matching_rule_decides() {
        let policy = Policy::parse(
            "rules:\n  - repository: reg.example/dev/*\n    unsigned: allow\n  - repository: reg.example/**\n    keyless:\n      issuer: https://issuer\n      identity: me\n",
        )
        .unwrap();
        assert!(matches!(policy.rule_for("reg.example/dev/a").unwrap().requirement, Requirement::Unsigned));
        assert!(matches!(policy.rule_for("reg.example/dev/a/b").unwrap().requirement, Requirement::Keyless { .. }));
        assert!(matches!(policy.rule_for("reg.example/prod").unwrap().requirement, Requirement::Keyless { .. }));
        assert_eq!(policy.rules()[1].line, 4);
    }

    #[test]
    fn single_star_stays_within_a_component() {
        let re = compile_pattern("ghcr.io/schedkit/*").unwrap();
        assert!(re.is_match("ghcr.io/schedkit/scx_rusty"));
        assert!(!re.is_match("ghcr.io/schedkit/a/b"));
        assert!(!re.is_match("ghcr.io/schedkitx/a"));
        assert!(!re.is_match("xghcr.io/schedkit/a"));
    }

    #[test]
    fn short_names_are_compared_in_full() {
        assert_eq!(full_repository("busybox"), "docker.io/library/busybox");
        assert_eq!(full_repository("x/y"), "docker.io/x/y");
        assert_eq!(full_repository("localhost/y"), "localhost/y");
        assert_eq!(full_repository("127.0.0.1:5000/y"), "127.0.0.1:5000/y");
        let policy = Policy::parse("rules:\n  - repository: docker.io/library/*\n    unsigned: allow\n").unwrap();
        assert!(policy.rule_for("busybox").is_some());
    }

    #[test]
    fn identity_patterns_are_anchored() {
        let policy = Policy::parse(
            "rules:\n  - repository: r.io/*\n    keyless:\n      issuer: https://i\n      identityRegExp: https://github\\.com/org/.*\n",
        )
        .unwrap();
        let Requirement::Keyless { identity, .. } = &policy.rules()[0].requirement else { panic!() };
        assert!(identity.matches("https://github.com/org/x"));
        assert!(!identity.matches("evil https://github.com/org/x"));
    }

    #[test]
    fn mistakes_name_their_line_and_the_fix() {
        let cases = [
            ("rules:\n  - repository: a.io/*\n    unsigned: yes-please\n", 2, "accepts only `allow`"),
            (
                "rules:\n  - repository: a.io/*\n    unsigned: allow\n  - keyless: {issuer: x, identity: y}\n",
                4,
                "no `repository`",
            ),
            ("rules:\n  - repository: a.io/*\n    keyless:\n      identity: y\n", 2, "needs `issuer`"),
            ("rules:\n  - repository: a.io/*\n    keyless:\n      issuer: x\n", 2, "exactly one of `identity`"),
            ("rules:\n  - repository: a.io/*\n    publicKey: abc\n", 2, "PEM public key"),
            ("rules:\n  - repository: a.io/*\n    unsigned: allow\n    publicKey: x\n", 2, "exactly one of"),
            ("rules:\n  - repository: a.io/[x]\n    unsigned: allow\n", 2, "not allowed"),
            (
                "rules:\n  - repository: a.io/x\n    keyless:\n      issuer: x\n      identityRegExp: '('\n",
                2,
                "does not compile",
            ),
        ];
        for (doc, line, needle) in cases {
            let err = Policy::parse(doc).unwrap_err();
            assert_eq!(err.line, line, "{doc}: {err}");
            assert!(err.to_string().contains(needle), "{doc}: {err}");
        }
    }

    #[test]
    fn an_empty_policy_is_an_error_but_an_empty_rule_list_is_not() {
        assert!(Policy::parse("").unwrap_err().message.contains("rules:"));
        assert!(Policy::parse("\n  \n").is_err());
        assert!(Policy::parse("# nothing\n").is_err());
        let none = Policy::parse("rules: []\n").unwrap();
        assert!(none.rule_for("ghcr.io/schedkit/x").is_none());
    }

    #[test]
    fn yaml_errors_carry_a_line() {
        let err = Policy::parse("rules:\n  - repository: a.io/*\n    unsigned: allow\n  - [oops\n").unwrap_err();
        assert!(err.line >= 4, "{err}");
        let err = Policy::parse("rules:\n  - repository: a.io/*\n    colour: red\n").unwrap_err();
        assert!(err.message.contains("colour"), "{err}");
        assert!(err.line >= 2, "{err}");
    }

    const TEAM_POLICY: &str = "callers:\n  groups: [platform]\nrules:\n  - repository: reg.example/team-a/**\n    callers:\n      serviceAccounts: [team-a:ci]\n    unsigned: allow\n  - repository: reg.example/**\n    unsigned: allow\n";

    fn caller<'a>(username: &'a str, groups: &'a [String]) -> Caller<'a> {
        Caller { username, groups }
    }

    #[test]
    fn team_ci_deploys_its_repository_and_only_the_platform_group_the_rest() {
        let policy = Policy::parse(TEAM_POLICY).unwrap();
        let platform = vec!["platform".to_owned(), "system:authenticated".to_owned()];
        let none: Vec<String> = Vec::new();
        let ci = "system:serviceaccount:team-a:ci";
        assert!(policy.check_caller("reg.example/team-a/rusty", caller(ci, &none)).is_ok());
        assert!(policy.check_caller("reg.example/team-a/rusty", caller("alice", &platform)).is_ok());
        assert!(policy.check_caller("reg.example/other/lavd", caller("alice", &platform)).is_ok());
        let refused = policy.check_caller("reg.example/other/lavd", caller(ci, &none)).unwrap_err().0;
        assert!(refused.starts_with("service account team-a:ci (groups: no groups) may not create or change Schedulers that run images of reg.example/other/lavd: the trust policy allows for every image: groups platform (line 2)"), "{refused}");
        assert!(refused.contains("added to `callers`"), "{refused}");
        let refused = policy.check_caller("reg.example/team-a/x", caller("bob", &none)).unwrap_err().0;
        assert!(refused.contains("user \"bob\""), "{refused}");
        assert!(refused.contains("for \"reg.example/team-a/**\": service accounts team-a:ci (line 6)"), "{refused}");
    }

    #[test]
    fn without_lists_anyone_rbac_lets_in_may_deploy() {
        let policy = Policy::parse("rules:\n  - repository: a.io/**\n    unsigned: allow\n  - repository: b.io/**\n    callers:\n      users: [alice]\n    unsigned: allow\n").unwrap();
        let none: Vec<String> = Vec::new();
        assert!(policy.check_caller("a.io/x", caller("anyone", &none)).is_ok());
        assert!(policy.check_caller("c.io/x", caller("anyone", &none)).is_ok(), "no rule: the image check refuses it");
        assert!(policy.check_caller("b.io/x", caller("alice", &none)).is_ok());
        assert!(policy.check_caller("b.io/x", caller("anyone", &none)).is_err());
    }

    #[test]
    fn service_accounts_are_written_short_or_in_full() {
        let policy = Policy::parse(
            "callers:\n  serviceAccounts: [ci:deployer, 'system:serviceaccount:ops:sked']\n  users: [carol]\nrules: []\n",
        )
        .unwrap();
        let none: Vec<String> = Vec::new();
        for user in ["system:serviceaccount:ci:deployer", "system:serviceaccount:ops:sked", "carol"] {
            assert!(policy.check_caller("r.io/x", caller(user, &none)).is_ok(), "{user}");
        }
        for user in ["ci:deployer", "system:serviceaccount:ci:other", "Carol"] {
            assert!(policy.check_caller("r.io/x", caller(user, &none)).is_err(), "{user}");
        }
    }

    #[test]
    fn caller_mistakes_name_their_line() {
        let cases = [
            ("callers: {}\nrules: []\n", 1, "lists no one"),
            ("rules:\n  - repository: a.io/*\n    unsigned: allow\n    callers:\n      users: []\n", 5, "lists no one"),
            ("callers:\n  serviceAccounts: [deployer]\nrules: []\n", 2, "not a service account"),
            ("callers:\n  serviceAccounts: ['a:b:c']\nrules: []\n", 2, "not a service account"),
            ("callers:\n  users: ['']\nrules: []\n", 2, "empty user or group"),
            ("callers:\n  teams: [x]\nrules: []\n", 2, "teams"),
        ];
        for (doc, line, needle) in cases {
            let err = Policy::parse(doc).unwrap_err();
            assert!(err.to_string().contains(needle), "{doc}: {err}");
            assert_eq!(err.line, line, "{doc}: {err}");
        }
    }
}
