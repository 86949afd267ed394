//! TLS settings from files: the server's certificate chain and key
//! (`RELAY_TLS_CERT`, `RELAY_TLS_KEY`), and what a client trusts (the
//! tools' `--ca`, `RELAY_REDIS_CA`, the system's bundle, or the bundled
//! Mozilla roots). Everything uses rustls with the ring provider, the one
//! crypto library of the binary. Errors are sentences that name the file.
//! The connections themselves are driven elsewhere: the server's in the
//! loop (`net::stream`), the tools' blocking (`cli::client`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// The only application protocol spoken over TLS (WebSockets upgrade
/// from it).
pub const ALPN_HTTP11: &[u8] = b"http/1.1";

/// Where Linux distributions keep the PEM bundle of trusted roots:
/// Debian and Ubuntu, Fedora and RHEL, Alpine, openSUSE.
const SYSTEM_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
    "/etc/ssl/ca-bundle.pem",
];

/// The server's certificate files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The server's TLS settings: TLS 1.2 and 1.3, ALPN `http/1.1`, the chain
/// and key read from `files`. Called at start (an error exits 2) and on
/// SIGHUP (an error keeps the settings in use).
pub fn server_config(files: &CertFiles) -> Result<Arc<ServerConfig>, String> {
    let chain = read_certs(&files.cert)?;
    let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|e| {
        format!(
            "cannot read a private key from {}: {}",
            files.key.display(),
            pem_error(e)
        )
    })?;
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(rustls::ALL_VERSIONS)
        .map_err(|e| format!("TLS settings: {e}"))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| {
            format!(
                "the key in {} does not fit the certificate in {}: {e}",
                files.key.display(),
                files.cert.display()
            )
        })?;
    config.alpn_protocols = vec![ALPN_HTTP11.to_vec()];
    Ok(Arc::new(config))
}

/// What a client trusts: only the certificates in `ca` when given (a
/// private CA or a self-signed certificate); else the system's bundle
/// (`ssl_cert_file`, the `SSL_CERT_FILE` convention, first), else the
/// Mozilla roots built into the binary (a `FROM scratch` image has no
/// bundle). Verification cannot be turned off.
pub fn client_config(
    ca: Option<&Path>,
    ssl_cert_file: Option<&Path>,
    alpn: Option<&[u8]>,
) -> Result<Arc<ClientConfig>, String> {
    let mut roots = RootCertStore::empty();
    if let Some(ca) = ca {
        let (added, _) = roots.add_parsable_certificates(read_certs(ca)?);
        if added == 0 {
            return Err(format!("{}: no usable CA certificate in it", ca.display()));
        }
    } else if !system_roots(&mut roots, ssl_cert_file) {
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    }
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(rustls::ALL_VERSIONS)
        .map_err(|e| format!("TLS settings: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    if let Some(alpn) = alpn {
        config.alpn_protocols = vec![alpn.to_vec()];
    }
    Ok(Arc::new(config))
}

/// Adds the first system bundle that holds a certificate; false when none
/// does.
fn system_roots(roots: &mut RootCertStore, ssl_cert_file: Option<&Path>) -> bool {
    let candidates = ssl_cert_file
        .into_iter()
        .chain(SYSTEM_BUNDLES.iter().map(Path::new));
    for path in candidates {
        let Ok(iter) = CertificateDer::pem_file_iter(path) else {
            continue;
        };
        let (added, _) = roots.add_parsable_certificates(iter.filter_map(Result::ok));
        if added > 0 {
            return true;
        }
    }
    false
}

/// The first DNS name (not a wildcard) the first certificate in a PEM
/// file is valid for: the name `relay health` checks the server's own
/// certificate against when it connects over loopback.
pub fn certificate_name(path: &Path) -> Option<String> {
    let first = read_certs(path).ok()?.into_iter().next()?;
    let cert = webpki::EndEntityCert::try_from(&first).ok()?;
    cert.valid_dns_names()
        .find(|n| !n.starts_with('*'))
        .map(str::to_string)
}

/// Every certificate in a PEM file, in order; none is an error.
fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Result<Vec<_>, _> = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("cannot read {}: {}", path.display(), pem_error(e)))?
        .collect();
    let certs = certs.map_err(|e| format!("cannot read {}: {}", path.display(), pem_error(e)))?;
    if certs.is_empty() {
        return Err(format!(
            "{}: no PEM certificate (-----BEGIN CERTIFICATE-----) in it",
            path.display()
        ));
    }
    Ok(certs)
}

fn pem_error(e: rustls_pki_types::pem::Error) -> String {
    use rustls_pki_types::pem::Error;
    match e {
        Error::Io(e) => e.to_string(),
        Error::NoItemsFound => "no PEM item of the expected kind in it".into(),
        other => format!("not valid PEM ({other:?})"),
    }
}

/// A sentence for a failed TLS handshake, found inside an I/O error (rustls
/// reports its errors through `io::Error`); `None` when the error is not
/// about TLS. The two a user meets most, an untrusted certificate and a
/// certificate for another name, say what to do.
pub fn describe_io(e: &std::io::Error, host: &str) -> Option<String> {
    let inner = e.get_ref()?.downcast_ref::<rustls::Error>()?;
    Some(describe(inner, host))
}

/// See [`describe_io`].
pub fn describe(e: &rustls::Error, host: &str) -> String {
    use rustls::{CertificateError, Error};
    match e {
        Error::InvalidCertificate(CertificateError::UnknownIssuer) => format!(
            "the certificate of {host} is not trusted (unknown issuer): for a private CA or a \
             self-signed certificate, pass its PEM file with --ca"
        ),
        Error::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
        ) => format!("the certificate of {host} is not valid for the name {host}"),
        Error::InvalidCertificate(
            CertificateError::Expired | CertificateError::ExpiredContext { .. },
        ) => {
            format!("the certificate of {host} has expired")
        }
        // webpki's refusal of a self-signed certificate made as a CA, which
        // `openssl req -x509` does unless told otherwise.
        other if other.to_string().contains("CaUsedAsEndEntity") => format!(
            "the certificate of {host} is a CA certificate, which cannot serve as a server's: \
             make a self-signed one with -addext basicConstraints=critical,CA:FALSE"
        ),
        other => format!("TLS with {host} failed: {other}"),
    }
}
