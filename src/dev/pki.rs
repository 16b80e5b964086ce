//! Certificates of the local control plane: one CA, the apiserver's serving certificate,
//! one admin client certificate (O=system:masters) shared by kubectl, kube-controller-manager,
//! kwok and the tests, and the service-account signing key pair. ECDSA P-256 throughout.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};

use super::error::{IoContext, Result};

/// PEM material produced by [`generate`].
pub struct Pki {
    pub ca_cert: String,
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

pub fn generate() -> Result<Pki> {
    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.distinguished_name = dn("envbridge-dev-ca", None);
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca_params, &ca_key);

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

    let admin_key = KeyPair::generate()?;
    let mut admin = CertificateParams::new(Vec::<String>::new())?;
    admin.distinguished_name = dn("envbridge-admin", Some("system:masters"));
    admin.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    admin.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let admin_cert = admin.signed_by(&admin_key, &issuer)?;

    let sa = KeyPair::generate()?;
    Ok(Pki {
        ca_cert: ca_cert.pem(),
        serving_cert: serving_cert.pem(),
        serving_key: serving_key.serialize_pem(),
        admin_cert: admin_cert.pem(),
        admin_key: admin_key.serialize_pem(),
        sa_key: sa.serialize_pem(),
        sa_pub: sa.public_key_pem(),
    })
}

/// Where [`write`] puts the files in `dir` (for restarting a component of a running plane,
/// which only fault tests do).
#[cfg(feature = "test-support")]
pub fn files(dir: &Path) -> PkiFiles {
    PkiFiles {
        ca_cert: dir.join("ca.crt"),
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
