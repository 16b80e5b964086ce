//! The admin kubeconfig written into the state directory (certificates by path).

use std::path::Path;

pub const CONTEXT: &str = "envbridge-dev";

/// Quote a string for YAML (a JSON string is a valid YAML double-quoted scalar).
fn q(s: &str) -> String {
    serde_json::Value::from(s).to_string()
}

/// Render a kubeconfig for `server` using the CA and the admin client certificate files.
pub fn render(server: &str, ca: &Path, cert: &Path, key: &Path) -> String {
    format!(
        "apiVersion: v1\n\
         kind: Config\n\
         clusters:\n\
         - name: {CONTEXT}\n  \
           cluster:\n    \
             server: {server}\n    \
             certificate-authority: {ca}\n\
         users:\n\
         - name: envbridge-admin\n  \
           user:\n    \
             client-certificate: {cert}\n    \
             client-key: {key}\n\
         contexts:\n\
         - name: {CONTEXT}\n  \
           context:\n    \
             cluster: {CONTEXT}\n    \
             user: envbridge-admin\n\
         current-context: {CONTEXT}\n",
        server = q(server),
        ca = q(&ca.to_string_lossy()),
        cert = q(&cert.to_string_lossy()),
        key = q(&key.to_string_lossy()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kube_rs_reads_what_we_write() {
        let text = render(
            "https://127.0.0.1:6443",
            Path::new("/s/pki/ca.crt"),
            Path::new("/s/pki/admin \"x\".crt"),
            Path::new("/s/pki/admin.key"),
        );
        let kc = kube::config::Kubeconfig::from_yaml(&text).expect("parses");
        assert_eq!(kc.current_context.as_deref(), Some(CONTEXT));
        let cluster = kc.clusters[0].cluster.as_ref().expect("cluster");
        assert_eq!(cluster.server.as_deref(), Some("https://127.0.0.1:6443"));
        assert_eq!(
            cluster.certificate_authority.as_deref(),
            Some("/s/pki/ca.crt")
        );
        let user = kc.auth_infos[0].auth_info.as_ref().expect("user");
        assert_eq!(
            user.client_certificate.as_deref(),
            Some("/s/pki/admin \"x\".crt")
        );
        assert_eq!(user.client_key.as_deref(), Some("/s/pki/admin.key"));
    }
}
