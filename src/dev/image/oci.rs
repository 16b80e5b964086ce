//! The OCI image-spec documents, as structs so that field order (and so every digest) is
//! fixed by the code and not by a map's iteration order.

use std::collections::BTreeMap;

use serde::Serialize;
use sha2::{Digest, Sha256};

pub const MEDIA_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const MEDIA_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const MEDIA_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub const MEDIA_LAYER: &str = "application/vnd.oci.image.layer.v1.tar";
/// containerd's import names an image after this annotation (kept verbatim when it is a
/// full reference); other tools read the OCI one.
pub const ANNOTATION_CONTAINERD_NAME: &str = "io.containerd.image.name";
pub const ANNOTATION_REF_NAME: &str = "org.opencontainers.image.ref.name";
pub const LAYOUT: &str = r#"{"imageLayoutVersion":"1.0.0"}"#;

#[derive(Serialize, Clone)]
pub struct Descriptor {
    #[serde(rename = "mediaType")]
    pub media_type: &'static str,
    pub digest: String,
    pub size: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub platform: Option<Platform>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<&'static str, String>,
}

impl Descriptor {
    pub fn of(media_type: &'static str, blob: &[u8]) -> Self {
        Self::new(media_type, sha256(blob), blob.len() as u64)
    }

    pub fn new(media_type: &'static str, digest: String, size: u64) -> Self {
        Self {
            media_type,
            digest,
            size,
            platform: None,
            annotations: BTreeMap::new(),
        }
    }
}

#[derive(Serialize, Clone)]
pub struct Platform {
    pub architecture: &'static str,
    pub os: &'static str,
}

impl Platform {
    /// This machine's, in OCI (Go) names: the layer holds its binaries.
    pub fn host() -> Self {
        let architecture = match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            other => other,
        };
        Self {
            architecture,
            os: "linux",
        }
    }
}

#[derive(Serialize)]
pub struct Config<'a> {
    pub architecture: &'static str,
    pub os: &'static str,
    pub config: RunConfig<'a>,
    pub rootfs: RootFs<'a>,
}

#[derive(Serialize)]
pub struct RunConfig<'a> {
    #[serde(rename = "Env")]
    pub env: &'a [&'a str],
    #[serde(rename = "Entrypoint")]
    pub entrypoint: &'a [String],
    #[serde(rename = "Cmd", skip_serializing_if = "<[_]>::is_empty")]
    pub cmd: &'a [String],
    #[serde(rename = "WorkingDir")]
    pub working_dir: &'a str,
    #[serde(rename = "Labels", skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: &'a BTreeMap<String, String>,
}

#[derive(Serialize)]
pub struct RootFs<'a> {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub diff_ids: [&'a str; 1],
}

#[derive(Serialize)]
pub struct Manifest<'a> {
    #[serde(rename = "schemaVersion")]
    pub schema_version: u32,
    #[serde(rename = "mediaType")]
    pub media_type: &'static str,
    pub config: &'a Descriptor,
    pub layers: [&'a Descriptor; 1],
}

#[derive(Serialize)]
pub struct Index<'a> {
    #[serde(rename = "schemaVersion")]
    pub schema_version: u32,
    #[serde(rename = "mediaType")]
    pub media_type: &'static str,
    pub manifests: &'a [Descriptor],
}

pub fn sha256(blob: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(blob)))
}
