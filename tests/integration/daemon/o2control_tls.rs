//! The o2control listener with client certificates (`--o2control-client-ca`, required
//! beyond loopback; docs/o2control.md): the certificate's subject CN is the caller, its role
//! the token file's entry of that name. Served on loopback here (the network rule), with the
//! same settings a listener beyond it needs.

use std::os::unix::fs::PermissionsExt;

use envbridge::server::o2control::pb::o2control as o2;
use o2::control_client::ControlClient;
use rcgen::{CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, KeyPair};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

use super::fixture::Setup;
use super::o2control::{WAIT, daemon_with};

/// A client certificate of the plane's test CA for `cn`: (certificate, key) PEM.
fn client_cert(issuer: &rcgen::Issuer<'_, KeyPair>, cn: &str) -> (String, String) {
    let key = KeyPair::generate().expect("key");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    params.distinguished_name = dn;
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let cert = params.signed_by(&key, issuer).expect("signed");
    (cert.pem(), key.serialize_pem())
}

/// A client of the listener presenting `identity` (or none).
async fn connect(
    port: u16,
    ca: &str,
    identity: Option<(String, String)>,
) -> Option<ControlClient<Channel>> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .domain_name("localhost");
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    let channel = Channel::from_shared(format!("https://127.0.0.1:{port}"))
        .expect("uri")
        .tls_config(tls)
        .expect("tls")
        .connect()
        .await
        .ok()?;
    Some(ControlClient::new(channel))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_name_the_caller_and_the_token_file_its_role() {
    let ns = Setup::shared("daemon-o2control-tls").await;
    let dir = tempfile::tempdir().expect("dir");
    let pki = envbridge::dev::pki::generate().expect("a CA and a serving certificate");
    let issuer = envbridge::dev::pki::issuer_from(&pki.ca_key).expect("the CA as issuer");
    let write = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).expect("write");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        p.to_str().expect("utf-8").to_string()
    };
    let ca = write("ca.pem", &pki.ca_cert);
    let cert = write("serving.pem", &pki.serving_cert);
    let key = write("serving.key", &pki.serving_key);
    let tokens = write(
        "tokens.yaml",
        "tokens:\n  - {name: alice, role: operator, token: alice-token-0123456789}\n  - {name: vera, role: viewer, token: vera-token-0123456789}\n",
    );
    let args = [
        "--token-file",
        &tokens,
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
        "--o2control-client-ca",
        &ca,
    ];
    let (_port, o2port, _daemon) = daemon_with(&ns, &args).await;

    let alice = client_cert(&issuer, "alice");
    let mut as_alice = crate::support::wait_for("the o2control listener", WAIT, || {
        let (ca, alice) = (pki.ca_cert.clone(), alice.clone());
        async move {
            let mut c = connect(o2port, &ca, Some(alice)).await?;
            c.get_framework_info(o2::GetFrameworkInfoRequest {})
                .await
                .ok()?;
            Some(c)
        }
    })
    .await;
    let info = as_alice
        .get_framework_info(o2::GetFrameworkInfoRequest {})
        .await
        .expect("alice reads")
        .into_inner();
    assert!(info.instance_name.starts_with("envbridge@"));
    // alice is an operator: past the role check (no such environment is what stops her).
    let e = as_alice
        .control_environment(o2::ControlEnvironmentRequest {
            id: "no-such-env".into(),
            r#type: o2::control_environment_request::Optype::Configure as i32,
            request_user: None,
        })
        .await
        .expect_err("no such environment");
    assert_eq!(e.code(), tonic::Code::NotFound, "{}", e.message());

    // vera is a viewer: she reads, and may not control, her name in the refusal.
    let mut as_vera = connect(o2port, &pki.ca_cert, Some(client_cert(&issuer, "vera")))
        .await
        .expect("vera connects");
    as_vera
        .get_environments(o2::GetEnvironmentsRequest::default())
        .await
        .expect("vera reads");
    let e = as_vera
        .control_environment(o2::ControlEnvironmentRequest {
            id: "no-such-env".into(),
            r#type: o2::control_environment_request::Optype::Configure as i32,
            request_user: None,
        })
        .await
        .expect_err("a viewer may not control");
    assert_eq!(e.code(), tonic::Code::PermissionDenied);
    assert!(
        e.message().contains("CN=vera") && e.message().contains("viewer"),
        "{}",
        e.message()
    );

    // A certificate of the CA whose name the token file does not hold: refused.
    if let Some(mut as_mallory) =
        connect(o2port, &pki.ca_cert, Some(client_cert(&issuer, "mallory"))).await
    {
        let e = as_mallory
            .get_environments(o2::GetEnvironmentsRequest::default())
            .await
            .expect_err("mallory is nobody");
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
        assert!(e.message().contains("CN=mallory"), "{}", e.message());
    }
    // No client certificate: the handshake or the first call fails.
    let refused = match connect(o2port, &pki.ca_cert, None).await {
        None => true,
        Some(mut c) => c
            .get_environments(o2::GetEnvironmentsRequest::default())
            .await
            .is_err(),
    };
    assert!(refused, "a caller without a certificate was served");
    // A certificate of another CA: refused too.
    let other = envbridge::dev::pki::generate().expect("another CA");
    let stranger = envbridge::dev::pki::issuer_from(&other.ca_key).expect("issuer");
    let refused = match connect(o2port, &pki.ca_cert, Some(client_cert(&stranger, "alice"))).await {
        None => true,
        Some(mut c) => c
            .get_environments(o2::GetEnvironmentsRequest::default())
            .await
            .is_err(),
    };
    assert!(refused, "a certificate of another CA was served");
}
