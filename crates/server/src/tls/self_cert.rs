//! `--auto-tls` / `--peer-auto-tls` (etcd's `transport.SelfCert`): a
//! self-signed ECDSA P-256 certificate for the hosts of the listen URLs,
//! valid `--self-signed-cert-validity` years, kept in
//! `<data-dir>/fixtures/{client,peer}/{cert,key}.pem` and reused at the
//! next start. Such certificates only encrypt: nobody can verify them, so
//! a member dials its peers' self-signed certificates without verifying
//! them (etcd's `InsecureSkipVerify`), and asks nothing of clients.

use anyhow::Context;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

/// The certificate and key files in `dir`, made now if missing. A
/// validity of 0 years is refused first, even when the files exist, with
/// etcd's words.
pub fn ensure(dir: &Path, hosts: &[String], years: u32) -> anyhow::Result<(PathBuf, PathBuf)> {
    if years == 0 {
        anyhow::bail!("selfSignedCertValidity is invalid,it should be greater than 0");
    }
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    if cert.exists() && key.exists() {
        return Ok((cert, key));
    }
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    for h in hosts {
        params.subject_alt_names.push(match h.parse::<IpAddr>() {
            Ok(ip) => rcgen::SanType::IpAddress(ip),
            Err(_) => rcgen::SanType::DnsName(h.clone().try_into()?),
        });
    }
    // subject "O=etcd" only, as etcd's
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "etcd");
    params.extended_key_usages = vec![
        rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        rcgen::ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now;
    params.not_after = now + time::Duration::days(365 * i64::from(years));
    let key_pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let c = params.self_signed(&key_pair)?;
    std::fs::write(&cert, c.pem()).with_context(|| format!("cannot write {}", cert.display()))?;
    write_private(&key, key_pair.serialize_pem().as_bytes())?;
    tracing::info!(cert = %cert.display(), hosts = ?hosts, "created a self-signed certificate");
    Ok((cert, key))
}

/// Writes a private key readable by its owner only.
fn write_private(path: &Path, data: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    f.write_all(data)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_self_signed_certificate_names_the_hosts_and_is_reused() {
        let dir = tempfile::tempdir().unwrap();
        let hosts = vec!["127.0.0.1".to_string(), "localhost".to_string()];
        let (cert, key) = ensure(dir.path(), &hosts, 1).unwrap();
        let pem = std::fs::read(&cert).unwrap();
        use rustls_pki_types::pem::PemObject;
        let der = rustls_pki_types::CertificateDer::from_pem_slice(&pem).unwrap();
        assert!(super::super::names::matches_hostname(&der, "127.0.0.1"));
        assert!(super::super::names::matches_hostname(&der, "localhost"));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&key).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        // a second start keeps the same certificate
        ensure(dir.path(), &hosts, 1).unwrap();
        assert_eq!(std::fs::read(&cert).unwrap(), pem);
    }
}
