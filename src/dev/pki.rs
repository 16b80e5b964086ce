//! Certificates of the local control plane: one CA (its key kept, so real nodes joining later
//! get certificates of their own), the apiserver's serving certificate and its client
//! certificate towards kubelets, one admin client certificate (O=system:masters) shared by
//! kubectl, kube-controller-manager, kwok and the tests, and the service-account signing key
//! pair. ECDSA P-256 throughout.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};

use super::error::{IoContext, Result};

/// PEM material produced by [`generate`].
pub struct Pki {
    pub ca_cert: String,
    pub ca_key: String,
    pub kubelet_client_cert: String,
    pub kubelet_client_key: String,
    pub serving_cert: String,
    pub serving_key: String,
    pub admin_cert: String,
    pub admin_key: String,
    pub sa_key: String,
    pub sa_pub: String,
}

/// Paths of the written files.
#[derive(Debug, Clone)]
pub struct PkiFiles {
    pub ca_cert: PathBuf,
    pub ca_key: PathBuf,
    pub kubelet_client_cert: PathBuf,
    pub kubelet_client_key: PathBuf,
    pub serving_cert: PathBuf,
    pub serving_key: PathBuf,
    pub admin_cert: PathBuf,
    pub admin_key: PathBuf,
    pub sa_key: PathBuf,
    pub sa_pub: PathBuf,
}

fn dn(cn: &str, org: Option<&str>) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    if let Some(o) = org {
        dn.push(DnType::OrganizationName, o);
    }
    dn
}

/// The CA's parameters: the same every time, so that an issuer rebuilt from the kept key
/// ([`issuer_from`]) signs certificates that chain to the CA written at start.
fn ca_params() -> Result<CertificateParams> {
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.distinguished_name = dn("envbridge-dev-ca", None);
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    Ok(ca_params)
}

/// The plane's CA as an issuer, from its kept key (PEM).
pub fn issuer_from(ca_key_pem: &str) -> Result<Issuer<'static, KeyPair>> {
    Ok(Issuer::new(ca_params()?, KeyPair::from_pem(ca_key_pem)?))
}

fn client_cert(
    cn: &str,
    org: Option<&str>,
    issuer: &Issuer<'_, impl rcgen::SigningKey>,
) -> Result<(String, String)> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name = dn(cn, org);
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    Ok((params.signed_by(&key, issuer)?.pem(), key.serialize_pem()))
}

/// The user the apiserver is when it calls a kubelet (logs, exec); RBAC grants it
/// `system:kubelet-api-admin` and each kubelet authorizes it by webhook.
pub const KUBELET_CLIENT_USER: &str = "kube-apiserver-kubelet-client";

/// A real node's certificates: its client identity `system:node:<name>` (O=system:nodes,
/// what the Node authorizer recognises) and its serving certificate for `ip`.
pub struct NodeCerts {
    pub client_cert: String,
    pub client_key: String,
    pub serving_cert: String,
    pub serving_key: String,
}

pub fn issue_node(
    issuer: &Issuer<'_, impl rcgen::SigningKey>,
    name: &str,
    ip: std::net::Ipv4Addr,
) -> Result<NodeCerts> {
    let (client_cert, client_key) =
        client_cert(&format!("system:node:{name}"), Some("system:nodes"), issuer)?;
    let serving_key = KeyPair::generate()?;
    let mut serving = CertificateParams::new(vec![name.to_string()])?;
    serving
        .subject_alt_names
        .push(SanType::IpAddress(ip.into()));
    serving.distinguished_name = dn(&format!("system:node:{name}"), Some("system:nodes"));
    serving.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    Ok(NodeCerts {
        client_cert,
        client_key,
        serving_cert: serving.signed_by(&serving_key, issuer)?.pem(),
        serving_key: serving_key.serialize_pem(),
    })
}

pub fn generate() -> Result<Pki> {
    let ca_key = KeyPair::generate()?;
    let ca_cert = ca_params()?.self_signed(&ca_key)?;
    let ca_key_pem = ca_key.serialize_pem();
    let issuer = Issuer::new(ca_params()?, &ca_key);

    let serving_key = KeyPair::generate()?;
    let mut serving = CertificateParams::new(vec![
        "localhost".to_string(),
        "kubernetes".to_string(),
        "kubernetes.default".to_string(),
        "kubernetes.default.svc".to_string(),
    ])?;
    serving
        .subject_alt_names
        .push(SanType::IpAddress([127, 0, 0, 1].into()));
    serving.distinguished_name = dn("kube-apiserver", None);
    serving.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let serving_cert = serving.signed_by(&serving_key, &issuer)?;

    let (admin_cert, admin_key) = client_cert("envbridge-admin", Some("system:masters"), &issuer)?;
    let (kubelet_client_cert, kubelet_client_key) =
        client_cert(KUBELET_CLIENT_USER, None, &issuer)?;

    let sa = KeyPair::generate()?;
    Ok(Pki {
        ca_cert: ca_cert.pem(),
        ca_key: ca_key_pem,
        kubelet_client_cert,
        kubelet_client_key,
        serving_cert: serving_cert.pem(),
        serving_key: serving_key.serialize_pem(),
        admin_cert,
        admin_key,
        sa_key: sa.serialize_pem(),
        sa_pub: sa.public_key_pem(),
    })
}

/// Where [`write`] puts the files in `dir` (for restarting a component of a running plane,
/// and for issuing a joining node's certificates from the kept CA key).
pub fn files(dir: &Path) -> PkiFiles {
    PkiFiles {
        ca_cert: dir.join("ca.crt"),
        ca_key: dir.join("ca.key"),
        kubelet_client_cert: dir.join("kubelet-client.crt"),
        kubelet_client_key: dir.join("kubelet-client.key"),
        serving_cert: dir.join("apiserver.crt"),
        serving_key: dir.join("apiserver.key"),
        admin_cert: dir.join("admin.crt"),
        admin_key: dir.join("admin.key"),
        sa_key: dir.join("sa.key"),
        sa_pub: dir.join("sa.pub"),
    }
}

/// Write the files the components read into `dir` (keys mode 0600).
pub fn write(pki: &Pki, dir: &Path) -> Result<PkiFiles> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::create_dir_all(dir).ctx("creating the PKI directory", dir)?;
    let put = |name: &str, content: &str, secret: bool| -> Result<PathBuf> {
        let path = dir.join(name);
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create(true).truncate(true);
        if secret {
            opts.mode(0o600);
        }
        let mut f = opts.open(&path).ctx("writing", &path)?;
        std::io::Write::write_all(&mut f, content.as_bytes()).ctx("writing", &path)?;
        Ok(path)
    };
    Ok(PkiFiles {
        ca_cert: put("ca.crt", &pki.ca_cert, false)?,
        ca_key: put("ca.key", &pki.ca_key, true)?,
        kubelet_client_cert: put("kubelet-client.crt", &pki.kubelet_client_cert, false)?,
        kubelet_client_key: put("kubelet-client.key", &pki.kubelet_client_key, true)?,
        serving_cert: put("apiserver.crt", &pki.serving_cert, false)?,
        serving_key: put("apiserver.key", &pki.serving_key, true)?,
        admin_cert: put("admin.crt", &pki.admin_cert, false)?,
        admin_key: put("admin.key", &pki.admin_key, true)?,
        sa_key: put("sa.key", &pki.sa_key, true)?,
        sa_pub: put("sa.pub", &pki.sa_pub, false)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generates_distinct_pem_material() {
        let p = generate().expect("pki");
        for pem in [&p.ca_cert, &p.serving_cert, &p.admin_cert] {
            assert!(pem.starts_with("-----BEGIN CERTIFICATE-----"), "{pem}");
        }
        assert!(p.serving_key.contains("PRIVATE KEY"));
        assert!(p.admin_key.contains("PRIVATE KEY"));
        assert!(p.sa_pub.contains("PUBLIC KEY"));
        assert_ne!(p.serving_key, p.admin_key);
        assert_ne!(p.ca_cert, p.serving_cert);
    }

    #[test]
    fn a_rebuilt_issuer_signs_node_certificates_that_chain_to_the_ca() {
        let p = generate().expect("pki");
        let issuer = issuer_from(&p.ca_key).expect("issuer");
        let certs = issue_node(&issuer, "real001.cluster.local", [127, 3, 0, 1].into())
            .expect("node certs");
        assert!(certs.client_cert.starts_with("-----BEGIN CERTIFICATE-----"));
        // Same key as the CA written at start: the issuer's public key is the CA's.
        let ca_key = KeyPair::from_pem(&p.ca_key).expect("key");
        assert_eq!(
            issuer.key().public_key_raw(),
            ca_key.public_key_raw(),
            "rebuilt issuer has another key"
        );
        assert_ne!(certs.client_key, certs.serving_key);
    }

    #[test]
    fn writes_keys_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tmp");
        let files = write(&generate().expect("pki"), dir.path()).expect("write");
        let mode = std::fs::metadata(&files.sa_key)
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "sa.key readable by others");
        assert!(files.ca_cert.exists());
    }
}
