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
//! - Plain-HTTP endpoints (the metrics of `reprise serve` and of `reprise aggregate`)
//!   find the header with [`http_authorization`], the same way.

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

/// The value of the `Authorization` header in a raw HTTP/1.x request head (the bytes up
/// to the blank line; later bytes are ignored), without the optional whitespace around
/// it; `None` when there is none. Header names match without regard to case.
pub fn http_authorization(request: &[u8]) -> Option<&[u8]> {
    let head = match request.windows(4).position(|w| w == b"\r\n\r\n") {
        Some(end) => &request[..end],
        None => request,
    };
    head.split(|&b| b == b'\n').skip(1).find_map(|line| {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let colon = line.iter().position(|&b| b == b':')?;
        let (name, value) = (&line[..colon], &line[colon + 1..]);
        if !name.eq_ignore_ascii_case(b"authorization") {
            return None;
        }
        let start = value.iter().position(|&b| b != b' ' && b != b'\t').unwrap_or(value.len());
        let end = value.iter().rposition(|&b| b != b' ' && b != b'\t').map_or(start, |i| i + 1);
        Some(&value[start..end.max(start)])
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_header_is_found_in_any_case_and_trimmed() {
        let req = b"GET /metrics HTTP/1.1\r\nHost: x\r\nauthorization:  Bearer tok \t\r\n\r\nAuthorization: other";
        assert_eq!(http_authorization(req), Some(&b"Bearer tok"[..]));
        assert_eq!(http_authorization(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"), None);
        assert_eq!(http_authorization(b"Authorization: Bearer tok\r\n\r\n"), None); // the request line is not a header
        for (header, ok) in [("Bearer tok", true), ("bearer tok", true), ("tok", false), ("Bearer Bearer tok", false),
                             ("Bearer  tok", false), ("Basic tok", false)] {
            let req = format!("GET /metrics HTTP/1.1\r\nAuthorization: {header}\r\n\r\n");
            assert_eq!(check(Some("tok"), http_authorization(req.as_bytes())).is_ok(), ok, "{header}");
        }
    }

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
