//! The `webhook-signature` header of the Standard Webhooks specification
//! (<https://www.standardwebhooks.com>): `v1,<base64 of HMAC-SHA256(key, "<id>.<timestamp>.<body>")>`,
//! so that a receiver checks with an existing library that the request is the relay's and, from
//! `webhook-timestamp`, that it is not an old one replayed.

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The prefix of a key given in base64, as Standard Webhooks secrets are written.
const KEY_PREFIX: &str = "whsec_";
const BASE64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// A signing key.
#[derive(Clone)]
pub struct SigningKey(Vec<u8>);

impl SigningKey {
    /// The key of `secret`: `whsec_<base64>` is the decoded bytes, anything else the bytes of
    /// the text as is.
    ///
    /// Returns an error if a `whsec_` secret is not valid base64.
    pub fn new(secret: &str) -> Result<Self, String> {
        match secret.strip_prefix(KEY_PREFIX) {
            Some(encoded) => base64_decode(encoded)
                .map(SigningKey)
                .ok_or_else(|| "sink.secret: the part after whsec_ is not base64".to_owned()),
            None => Ok(SigningKey(secret.as_bytes().to_vec())),
        }
    }

    /// The header value for a request with `webhook-id` `id`, `webhook-timestamp`
    /// `timestamp_secs` (Unix seconds) and `body`.
    pub fn sign(&self, id: &str, timestamp_secs: u64, body: &[u8]) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes any key length");
        mac.update(id.as_bytes());
        mac.update(format!(".{timestamp_secs}.").as_bytes());
        mac.update(body);
        format!("v1,{}", base64_encode(&mac.finalize().into_bytes()))
    }
}

/// RFC 4648 base64 with padding.
fn base64_encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(BASE64[(n >> (18 - 6 * i) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// RFC 4648 base64, padding optional; `None` on any other character.
fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let text = text.trim_end_matches('=');
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0);
    for c in text.bytes() {
        let v = BASE64.iter().position(|b| *b == c)? as u32;
        acc = acc << 6 | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    (bits < 6).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trips_the_rfc_4648_vectors() {
        for (plain, encoded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64_encode(plain.as_bytes()), encoded);
            assert_eq!(base64_decode(encoded).unwrap(), plain.as_bytes());
        }
        assert_eq!(base64_decode("Zm9v YmFy"), None);
        assert_eq!(base64_decode("Z"), None);
    }

    #[test]
    fn signs_the_standard_webhooks_test_vector() {
        // The vector the specification's reference libraries test against.
        let key = SigningKey::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        assert_eq!(
            key.sign(
                "msg_p5jXN8AQM9LWM0D4loKWxJek",
                1614265330,
                br#"{"test": 2432232314}"#
            ),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
        assert!(SigningKey::new("whsec_not base64!").is_err());
        // A plain secret is its bytes: another signature for the same request.
        let plain = SigningKey::new("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        assert_ne!(
            plain.sign(
                "msg_p5jXN8AQM9LWM0D4loKWxJek",
                1614265330,
                br#"{"test": 2432232314}"#
            ),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }
}
