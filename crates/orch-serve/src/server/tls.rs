//! TLS on the TCP listener: the certificate and key of `tls_cert` and `tls_key`, read and checked
//! once at start (rustls on the ring provider), and what a connection does before HTTP: a TLS
//! handshake of its own, bounded in time, so a client that stalls or fails its handshake holds
//! only its own connection. A client speaking plain HTTP to the port gets one sentence in plain
//! HTTP saying to use https, and nothing else.

use crate::core::config::TlsFiles;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// Time a client has to finish its TLS handshake (as long as it has for its request headers).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The first byte of a TLS record carrying a handshake (a ClientHello opens every connection).
const HANDSHAKE_RECORD: u8 = 0x16;

/// Why the certificate or key cannot serve: which file, and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFileError {
    /// `tls_cert` or `tls_key`.
    pub key: &'static str,
    pub file: std::path::PathBuf,
    pub reason: String,
}

/// Reads `files` and makes the listener's TLS configuration (HTTP/1.1 by ALPN, TLS 1.2 and 1.3).
pub fn server_config(files: &TlsFiles) -> Result<Arc<rustls::ServerConfig>, TlsFileError> {
    let cert_err = |reason: String| TlsFileError {
        key: "tls_cert",
        file: files.cert.clone(),
        reason,
    };
    let key_err = |reason: String| TlsFileError {
        key: "tls_key",
        file: files.key.clone(),
        reason,
    };
    let certs = read_certs(&files.cert).map_err(cert_err)?;
    let key = read_key(&files.key).map_err(key_err)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| cert_err(format!("the TLS library refused its own defaults ({e})")))?
        .with_no_client_auth();
    let mut config = builder.with_single_cert(certs, key).map_err(|e| match e {
        rustls::Error::InconsistentKeys(_) => key_err(format!(
            "is not the private key of the certificate in {}; give the key that certificate was made for",
            files.cert.display()
        )),
        rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented => {
            cert_err(format!(
                "its first certificate cannot be read as X.509 ({e}); give the server's certificate first, then its chain"
            ))
        }
        other => key_err(format!(
            "is a key TLS cannot use here ({other}); give an RSA, ECDSA (P-256, P-384) or Ed25519 key"
        )),
    })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Every `CERTIFICATE` block of a PEM file, in order.
fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| pem_reason(&e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_reason(&e))?;
    if certs.is_empty() {
        return Err(
            "holds no certificate (no -----BEGIN CERTIFICATE----- block); give the server's certificate in PEM, then its chain"
                .into(),
        );
    }
    Ok(certs)
}

/// The first private key of a PEM file (PKCS#8, PKCS#1 or SEC1).
fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => {
            "holds no private key (no -----BEGIN PRIVATE KEY-----, RSA PRIVATE KEY or EC PRIVATE KEY block); give the certificate's key in PEM, unencrypted".into()
        }
        other => pem_reason(&other),
    })
}

fn pem_reason(e: &rustls::pki_types::pem::Error) -> String {
    match e {
        rustls::pki_types::pem::Error::Io(io) => format!("cannot be read ({io})"),
        other => format!("is not valid PEM ({other})"),
    }
}

/// What the first bytes of a connection to the TLS listener are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opening {
    /// A TLS handshake.
    Tls,
    /// Anything else: most likely plain HTTP.
    Other,
    /// The client closed before sending anything.
    Closed,
}

/// Looks at the first byte the client sent, without taking it.
pub async fn opening(stream: &tokio::net::TcpStream) -> std::io::Result<Opening> {
    let mut first = [0u8; 1];
    Ok(match stream.peek(&mut first).await? {
        0 => Opening::Closed,
        _ if first[0] == HANDSHAKE_RECORD => Opening::Tls,
        _ => Opening::Other,
    })
}

/// The answer to plain HTTP on the TLS port: 400 with one sentence, in plain HTTP (the client
/// can read nothing else), then the connection closes. It names no tenant and no job.
pub fn plain_http_answer(port: Option<u16>) -> Vec<u8> {
    let url = port.map_or_else(
        || "https://HOST/".to_string(),
        |p| format!("https://HOST:{p}/"),
    );
    crate::http::conns::plain_response(
        "400 Bad Request",
        &format!("this port serves HTTPS only: use an https:// address ({url}), not http://"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(dir: &Path, cert: &str, key: &str) -> TlsFiles {
        let (c, k) = (dir.join("cert.pem"), dir.join("key.pem"));
        std::fs::write(&c, cert).unwrap();
        std::fs::write(&k, key).unwrap();
        TlsFiles { cert: c, key: k }
    }

    fn temp(tag: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("orch-tls-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn files_that_cannot_serve_name_themselves_and_what_is_wrong() {
        let dir = temp("bad");
        let missing = TlsFiles {
            cert: dir.join("nope.pem"),
            key: dir.join("nope-key.pem"),
        };
        let e = server_config(&missing).unwrap_err();
        assert_eq!((e.key, e.file.clone()), ("tls_cert", missing.cert.clone()));
        assert!(e.reason.starts_with("cannot be read"), "{e:?}");

        let e = server_config(&files(&dir, "not a certificate\n", "")).unwrap_err();
        assert_eq!(e.key, "tls_cert");
        assert!(e.reason.contains("holds no certificate"), "{e:?}");

        let cert = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        let e = server_config(&files(&dir, cert, "nothing\n")).unwrap_err();
        assert_eq!(e.key, "tls_key");
        assert!(e.reason.contains("holds no private key"), "{e:?}");

        let e = server_config(&files(
            &dir,
            cert,
            "-----BEGIN PRIVATE KEY-----\n!!!!\n-----END PRIVATE KEY-----\n",
        ))
        .unwrap_err();
        assert_eq!(e.key, "tls_key");
        assert!(e.reason.contains("not valid PEM"), "{e:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn plain_http_gets_one_sentence_that_names_https() {
        let answer = String::from_utf8(plain_http_answer(Some(7878))).unwrap();
        assert!(answer.starts_with("HTTP/1.1 400 "), "{answer}");
        assert!(
            answer.ends_with(
                "{\"error\":\"this port serves HTTPS only: use an https:// address (https://HOST:7878/), not http://\"}"
            ),
            "{answer}"
        );
    }
}
