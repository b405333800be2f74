//! Decentralized authentication as `nsc` sets it up (NATS "operator mode"): an operator, one
//! account with JetStream, and `.creds` files of its users. The JWTs are v2 claims signed with
//! nkeys here (`{"typ":"JWT","alg":"ed25519-nkey"}`, base64url without padding, the signature
//! over `header.claims`), as nats-io/jwt's `Encode` writes them except for `jti`, which is a
//! unique string here rather than a hash of the claims (the server does not check it); nsc
//! cannot be installed here.

use std::time::{SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use nkeys::KeyPair;
use serde_json::{json, Value};

/// An operator, the account its users are in, and the system account JetStream needs, both
/// preloaded (`resolver: MEMORY`).
pub struct Operator {
    account: KeyPair,
    system: KeyPair,
    operator_jwt: String,
    account_jwt: String,
    system_jwt: String,
}

impl Operator {
    pub fn new() -> Self {
        let operator = KeyPair::new_operator();
        let account = KeyPair::new_account();
        let system = KeyPair::new_account();
        let operator_jwt = jwt(&operator, &operator.public_key(), "operator", json!({}));
        let limits = json!({
            "subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1,
            "wildcards": true, "conn": -1, "leaf": -1,
            // JetStream is on for an account whose storage limits are not 0.
            "mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1,
        });
        let account_jwt = jwt(
            &operator,
            &account.public_key(),
            "account",
            json!({ "limits": limits }),
        );
        // No limits, so no JetStream: nats-server refuses a system account with JetStream. No
        // client connects to it.
        let system_jwt = jwt(&operator, &system.public_key(), "account", json!({}));
        Operator {
            account,
            system,
            operator_jwt,
            account_jwt,
            system_jwt,
        }
    }

    /// nats-server configuration lines for operator mode with this operator and its accounts.
    pub fn server_config(&self) -> String {
        format!(
            "operator: \"{}\"\nsystem_account: {}\nresolver: MEMORY\n\
             resolver_preload: {{\n  {}: \"{}\"\n  {}: \"{}\"\n}}\n",
            self.operator_jwt,
            self.system.public_key(),
            self.account.public_key(),
            self.account_jwt,
            self.system.public_key(),
            self.system_jwt
        )
    }

    /// The text of a `.creds` file of a new user of the account, and the user's seed.
    pub fn user_creds(&self) -> (String, String) {
        creds(&self.account)
    }
}

/// The text of a `.creds` file of a user whose account no server here knows, and its seed.
pub fn stranger_creds() -> (String, String) {
    creds(&KeyPair::new_account())
}

fn creds(account: &KeyPair) -> (String, String) {
    let user = KeyPair::new_user();
    let user_jwt = jwt(
        account,
        &user.public_key(),
        "user",
        json!({ "pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1 }),
    );
    let seed = user.seed().unwrap();
    // The layout nsc writes (nats-io/jwt's FormatUserConfig).
    let text = format!(
        "-----BEGIN NATS USER JWT-----\n{user_jwt}\n------END NATS USER JWT------\n\n\
         ************************* IMPORTANT *************************\n\
         NKEY Seed printed below can be used to sign and prove identity.\n\
         NKEYs are sensitive and should be treated as secrets.\n\n\
         -----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n\n\
         *************************************************************\n"
    );
    (text, seed)
}

/// A JWT of claim type `kind` about `subject`, issued and signed by `issuer`, with `fields`
/// added to its `nats` object.
fn jwt(issuer: &KeyPair, subject: &str, kind: &str, fields: Value) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let mut nats = fields;
    nats["type"] = json!(kind);
    nats["version"] = json!(2);
    let claims = json!({
        "jti": format!("{kind}-{subject}-{now}"),
        "iat": now,
        "iss": issuer.public_key(),
        "name": kind,
        "sub": subject,
        "nats": nats,
    });
    let header = URL_SAFE_NO_PAD.encode(r#"{"typ":"JWT","alg":"ed25519-nkey"}"#);
    let signed = format!("{header}.{}", URL_SAFE_NO_PAD.encode(claims.to_string()));
    let signature = issuer.sign(signed.as_bytes()).unwrap();
    format!("{signed}.{}", URL_SAFE_NO_PAD.encode(signature))
}
