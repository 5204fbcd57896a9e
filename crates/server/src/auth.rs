//! The one token check of every Reprise endpoint (gRPC calls, the metrics endpoint,
//! and anything served later): an `Authorization: Bearer <token>` header whose token is
//! compared with the configured one byte for byte, in constant time.
//!
//! Rules, the same on every endpoint:
//! - The header value must be `Bearer`, one space, and the token: the scheme is matched
//!   without regard to case (RFC 7235 makes it case-insensitive), the token byte for byte.
//!   Nothing is trimmed here: a transport hands over the value as its protocol defines it
//!   (HTTP drops the optional whitespace around a header value; gRPC metadata has none).
//! - The comparison takes time independent of where the bytes first differ
//!   (`subtle::ConstantTimeEq`); only the token's length can be learned from timing.
//! - A server without a token accepts everything; one with a token checks it on every
//!   request, whatever address the endpoint listens on.

use subtle::ConstantTimeEq;

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No `Authorization` header, or an empty one.
    Missing,
    /// A header that is not `Bearer <the token>`.
    Wrong,
}

impl Refusal {
    /// The message a client sees.
    pub fn message(self) -> &'static str {
        match self {
            Refusal::Missing => "this server needs a token: pass token=... (sent as 'authorization: Bearer <token>')",
            Refusal::Wrong => "wrong token",
        }
    }
}

/// Checks the raw value of an `Authorization` header (`None` when the request had
/// none) against `expected`, the configured token (`None`: the server has no token).
pub fn check(expected: Option<&str>, header: Option<&[u8]>) -> Result<(), Refusal> {
    let Some(expected) = expected else { return Ok(()) };
    let value = header.unwrap_or(b"");
    if value.is_empty() {
        return Err(Refusal::Missing);
    }
    const SCHEME: &[u8] = b"bearer ";
    let presented = match value.get(..SCHEME.len()) {
        Some(scheme) if scheme.eq_ignore_ascii_case(SCHEME) => &value[SCHEME.len()..],
        _ => return Err(Refusal::Wrong),
    };
    if bool::from(presented.ct_eq(expected.as_bytes())) {
        Ok(())
    } else {
        Err(Refusal::Wrong)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "SeCrEt-Token";

    fn check_header(h: &str) -> Result<(), Refusal> {
        check(Some(TOKEN), Some(h.as_bytes()))
    }

    #[test]
    fn exact_token_is_accepted_with_any_scheme_case() {
        assert_eq!(check_header("Bearer SeCrEt-Token"), Ok(()));
        assert_eq!(check_header("bearer SeCrEt-Token"), Ok(()));
        assert_eq!(check_header("BEARER SeCrEt-Token"), Ok(()));
    }

    #[test]
    fn token_case_is_never_ignored() {
        for wrong in ["secret-token", "SECRET-TOKEN", "Secret-Token", "SeCrEt-TokeN"] {
            assert_eq!(check_header(&format!("Bearer {wrong}")), Err(Refusal::Wrong), "{wrong}");
        }
    }

    #[test]
    fn prefixes_extensions_and_other_schemes_are_refused() {
        for h in ["Bearer SeCrEt", "Bearer SeCrEt-Token2", "Bearer SeCrEt-Token x", "Bearer", "Bearer ", "Basic SeCrEt-Token", "SeCrEt-Token", "BearerSeCrEt-Token", "Bearer  SeCrEt-Token", "Bearer SeCrEt-Token ", " Bearer SeCrEt-Token"] {
            assert_eq!(check_header(h), Err(Refusal::Wrong), "{h:?}");
        }
    }

    #[test]
    fn missing_or_empty_header_is_missing() {
        assert_eq!(check(Some(TOKEN), None), Err(Refusal::Missing));
        assert_eq!(check_header(""), Err(Refusal::Missing));
    }

    #[test]
    fn no_configured_token_accepts_everything() {
        assert_eq!(check(None, None), Ok(()));
        assert_eq!(check(None, Some(b"Bearer anything")), Ok(()));
    }

    #[test]
    fn non_utf8_bytes_are_refused_not_panicking() {
        assert_eq!(check(Some(TOKEN), Some(b"Bearer \xff\xfe")), Err(Refusal::Wrong));
    }
}
