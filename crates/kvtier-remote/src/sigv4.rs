//! AWS Signature Version 4, header form: what the tier's direct reads ([`crate::http1`])
//! sign their GETs with, and what kvtier bench's load generator signs every request with
//! (so the bench measures what a real client costs the server).

use kvtier_core::hash::hex;
use sha2::{Digest, Sha256};

/// SHA-256 of the empty body, hex.
pub const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

/// HMAC-SHA256 (RFC 2104).
fn hmac(key: &[u8], data: &[u8]) -> [u8; 32] {
    let mut block = [0u8; 64];
    if key.len() > 64 {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let mut inner = Sha256::new();
    inner.update(block.map(|b| b ^ 0x36));
    inner.update(data);
    let mut outer = Sha256::new();
    outer.update(block.map(|b| b ^ 0x5c));
    outer.update(inner.finalize());
    outer.finalize().into()
}

/// SHA-256 of `body`, hex.
pub fn sha256_hex(body: &[u8]) -> String {
    hex(&Sha256::digest(body))
}

/// Credentials and region to sign with.
#[derive(Debug, Clone)]
pub struct Signer {
    /// Access key id.
    pub access_key: String,
    /// Secret key.
    pub secret_key: String,
    /// Region name (`us-east-1`).
    pub region: String,
    /// Session token of temporary credentials, sent and signed as `x-amz-security-token`.
    pub session_token: Option<String>,
}

/// The request line and headers of `method path` to `host`, with `extra` headers
/// (lower-case names), signed by `signer` over a body whose SHA-256 is `payload_sha256`
/// or unsigned without one; each line ends in CRLF, the blank line is left to the sender.
pub fn request_head(
    signer: Option<&Signer>,
    method: &str,
    host: &str,
    path: &str,
    extra: &[(&str, &str)],
    payload_sha256: &str,
) -> String {
    let mut headers: Vec<(&str, &str)> = vec![("host", host)];
    headers.extend_from_slice(extra);
    let mut out = format!("{method} {path} HTTP/1.1\r\n");
    let date;
    if let Some(s) = signer {
        date = amz_now();
        headers.push(("x-amz-content-sha256", payload_sha256));
        headers.push(("x-amz-date", &date));
        if let Some(token) = &s.session_token {
            headers.push(("x-amz-security-token", token));
        }
        headers.sort_by(|a, b| a.0.cmp(b.0));
        let auth = sign(s, method, path, "", &headers, payload_sha256, &date);
        out.push_str(&format!("authorization: {auth}\r\n"));
    }
    for (n, v) in &headers {
        out.push_str(&format!("{n}: {v}\r\n"));
    }
    out
}

/// `(amz_date, authorization)` for a request. `headers` are the other headers to sign,
/// lower-case names, sorted by name, `host` and `x-amz-*` included.
pub fn sign(
    s: &Signer,
    method: &str,
    path: &str,
    query: &str,
    headers: &[(&str, &str)],
    payload_sha256: &str,
    amz_date: &str,
) -> String {
    let date = &amz_date[..8];
    let canonical_headers: String = headers
        .iter()
        .map(|(n, v)| format!("{n}:{}\n", v.trim()))
        .collect();
    let signed: Vec<&str> = headers.iter().map(|(n, _)| *n).collect();
    let signed = signed.join(";");
    let canonical =
        format!("{method}\n{path}\n{query}\n{canonical_headers}\n{signed}\n{payload_sha256}");
    let scope = format!("{date}/{}/s3/aws4_request", s.region);
    let to_sign = format!(
        "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
        sha256_hex(canonical.as_bytes())
    );
    let k_date = hmac(format!("AWS4{}", s.secret_key).as_bytes(), date.as_bytes());
    let k_region = hmac(&k_date, s.region.as_bytes());
    let k_service = hmac(&k_region, b"s3");
    let k_signing = hmac(&k_service, b"aws4_request");
    let signature = hex(&hmac(&k_signing, to_sign.as_bytes()));
    format!(
        "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed}, Signature={signature}",
        s.access_key
    )
}

/// The current time as SigV4's `YYYYMMDDTHHMMSSZ`.
pub fn amz_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let days = secs / 86_400;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    )
}

/// Gregorian date of a day count since 1970-01-01 (Howard Hinnant's civil algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_matches_rfc_4231_case_2() {
        assert_eq!(
            hex(&hmac(b"Jefe", b"what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn dates_are_civil() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_779), (2026, 11, 22));
    }
}
