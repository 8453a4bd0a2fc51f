//! What a certificate names: its subject's common name and its subject
//! alternative names, read with `x509-parser`, and Go's hostname match
//! (`x509.Certificate.VerifyHostname`: IP SANs for an IP, DNS SANs with a
//! leading `*.` wildcard for a name; the common name is not used).

use std::net::IpAddr;
use x509_parser::extensions::GeneralName;

/// The subject's common name of an X.509 certificate in DER (the last one
/// if there are several, as Go's `pkix.Name.CommonName`).
pub fn common_name(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let cn = cert.subject().iter_common_name().last()?;
    cn.as_str().ok().map(str::to_string)
}

/// The DNS names and IP addresses among a certificate's subject
/// alternative names (empty for an unparsable certificate).
pub fn subject_alt_names(der: &[u8]) -> (Vec<String>, Vec<IpAddr>) {
    let mut dns = Vec::new();
    let mut ips = Vec::new();
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
        return (dns, ips);
    };
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for n in &san.value.general_names {
            match n {
                GeneralName::DNSName(d) => dns.push(d.to_ascii_lowercase()),
                GeneralName::IPAddress(b) => match b.len() {
                    4 => ips.push(IpAddr::from(<[u8; 4]>::try_from(*b).expect("4 bytes"))),
                    16 => ips.push(IpAddr::from(<[u8; 16]>::try_from(*b).expect("16 bytes"))),
                    _ => {}
                },
                _ => {}
            }
        }
    }
    (dns, ips)
}

/// Go's `VerifyHostname(host)` on a certificate in DER.
pub fn matches_hostname(der: &[u8], host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let (dns, ips) = subject_alt_names(der);
    if let Ok(ip) = host.parse::<IpAddr>() {
        return ips.contains(&ip);
    }
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    dns.iter()
        .any(|d| dns_matches(d.trim_end_matches('.'), &host))
}

fn dns_matches(pattern: &str, host: &str) -> bool {
    if let Some(rest) = pattern.strip_prefix("*.") {
        // one label, never the whole name
        return host
            .split_once('.')
            .is_some_and(|(first, tail)| !first.is_empty() && tail == rest);
    }
    pattern == host
}

#[cfg(test)]
mod tests {
    use super::*;

    fn der(pem: &str) -> Vec<u8> {
        use rustls_pki_types::pem::PemObject;
        rustls_pki_types::CertificateDer::from_pem_slice(pem.as_bytes())
            .unwrap()
            .to_vec()
    }

    #[test]
    fn test_names_of_a_certificate() {
        // subject "O=org, CN=bob", issued by "CN=the-ca", SANs
        // DNS:bob.example.com, DNS:*.wild.example.com, IP:127.0.0.1
        let d = der(include_str!("testdata/bob.pem"));
        assert_eq!(common_name(&d).as_deref(), Some("bob"));
        assert!(matches_hostname(&d, "127.0.0.1"));
        assert!(!matches_hostname(&d, "127.0.0.2"));
        assert!(matches_hostname(&d, "bob.example.com"));
        assert!(matches_hostname(&d, "BOB.example.com."));
        assert!(matches_hostname(&d, "x.wild.example.com"));
        assert!(!matches_hostname(&d, "wild.example.com"));
        assert!(!matches_hostname(&d, "a.b.wild.example.com"));
        assert!(!matches_hostname(&d, "bob"), "the CN is not a host name");
        // a truncated certificate names nothing, without a panic
        assert_eq!(common_name(&d[..d.len() / 2]), None);
        assert_eq!(subject_alt_names(&d[..10]), (vec![], vec![]));
        assert_eq!(common_name(&[0x30, 0x81]), None);
    }
}
