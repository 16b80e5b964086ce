//! One tar file in the OCI image-layout format (`oci-layout`, `index.json`,
//! `blobs/sha256/<hex>`) holding several images that share one layer.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::layer::Layer;
use super::oci::{self, Descriptor, Platform};
use super::ustar::{self, Kind};
use super::{Entry, ImageError};

/// The search path of every image: the executable first, then the host tools.
pub const PATH_ENV: &str = "PATH=/usr/local/bin:/usr/bin:/bin";

/// One image of the archive: a name and how it starts; its file system is the shared layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageSpec {
    /// A full reference (`localhost/envbridge:dev`): containerd keeps it as is.
    pub reference: String,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    pub labels: BTreeMap<String, String>,
}

/// A written archive and the manifest digest of each image, `(reference, "sha256:…")`, in
/// the order of the specs: what an imported image's digest is compared against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Archive {
    pub path: PathBuf,
    pub manifests: Vec<(String, String)>,
}

impl Archive {
    pub fn digest_of(&self, reference: &str) -> Option<&str> {
        self.manifests
            .iter()
            .find(|(r, _)| r == reference)
            .map(|(_, d)| d.as_str())
    }
}

/// Writes `images` over the layer made of `entries` to `out` (replaced atomically). Equal
/// entries and specs give byte-identical archives.
pub fn write_oci_archive(
    entries: &[Entry],
    out: &Path,
    images: &[ImageSpec],
) -> Result<Archive, ImageError> {
    check_specs(images)?;
    let layer = Layer::new(entries)?;
    let layer_desc = Descriptor::new(oci::MEDIA_LAYER, layer.digest(), layer.size());

    let platform = Platform::host();
    let mut blobs = BTreeMap::new();
    let mut index = Vec::new();
    for spec in images {
        let config = json(
            "config",
            &spec.reference,
            &oci::Config {
                architecture: platform.architecture,
                os: platform.os,
                config: oci::RunConfig {
                    env: &[PATH_ENV],
                    entrypoint: &spec.entrypoint,
                    cmd: &spec.cmd,
                    working_dir: "/",
                    labels: &spec.labels,
                },
                rootfs: oci::RootFs {
                    kind: "layers",
                    diff_ids: [&layer_desc.digest],
                },
            },
        )?;
        let config_desc = Descriptor::of(oci::MEDIA_CONFIG, &config);
        let manifest = json(
            "manifest",
            &spec.reference,
            &oci::Manifest {
                schema_version: 2,
                media_type: oci::MEDIA_MANIFEST,
                config: &config_desc,
                layers: [&layer_desc],
            },
        )?;
        let mut desc = Descriptor::of(oci::MEDIA_MANIFEST, &manifest);
        desc.platform = Some(platform.clone());
        for key in [oci::ANNOTATION_CONTAINERD_NAME, oci::ANNOTATION_REF_NAME] {
            desc.annotations.insert(key, spec.reference.clone());
        }
        blobs.insert(config_desc.digest, config);
        blobs.insert(desc.digest.clone(), manifest);
        index.push(desc);
    }
    let index_json = json(
        "index",
        "the archive",
        &oci::Index {
            schema_version: 2,
            media_type: oci::MEDIA_INDEX,
            manifests: &index,
        },
    )?;

    // Unique per writer, so concurrent builds of one archive never share a temporary file.
    static WRITERS: AtomicU64 = AtomicU64::new(0);
    let n = WRITERS.fetch_add(1, Ordering::Relaxed);
    let tmp = out.with_extension(format!("tmp-{}-{n}", std::process::id()));
    let written = write_file(&tmp, &layer, &layer_desc, &blobs, &index_json)
        .and_then(|()| std::fs::rename(&tmp, out));
    if let Err(source) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(ImageError::Write {
            path: out.into(),
            source,
        });
    }
    Ok(Archive {
        path: out.into(),
        manifests: images
            .iter()
            .zip(index)
            .map(|(spec, desc)| (spec.reference.clone(), desc.digest))
            .collect(),
    })
}

fn check_specs(images: &[ImageSpec]) -> Result<(), ImageError> {
    let spec_error = |reference: &str, reason| ImageError::Spec {
        reference: reference.to_string(),
        reason,
    };
    if images.is_empty() {
        return Err(spec_error("", "an archive needs at least one image"));
    }
    let mut seen = BTreeSet::new();
    for spec in images {
        // Only a full reference survives `ctr images import` without a prefix added.
        if !spec.reference.contains('/') || !spec.reference.contains(':') {
            return Err(spec_error(
                &spec.reference,
                "is not a full reference (host/name:tag)",
            ));
        }
        if !seen.insert(&spec.reference) {
            return Err(spec_error(&spec.reference, "is named twice"));
        }
        if spec.entrypoint.is_empty() {
            return Err(spec_error(&spec.reference, "has no entrypoint"));
        }
    }
    Ok(())
}

fn json(
    what: &'static str,
    reference: &str,
    doc: &impl serde::Serialize,
) -> Result<Vec<u8>, ImageError> {
    serde_json::to_vec(doc).map_err(|source| ImageError::Json {
        what,
        reference: reference.to_string(),
        source,
    })
}

/// Layout file first, then the blobs (layer, then the rest by digest), `index.json` last.
fn write_file(
    path: &Path,
    layer: &Layer,
    layer_desc: &Descriptor,
    blobs: &BTreeMap<String, Vec<u8>>,
    index: &[u8],
) -> std::io::Result<()> {
    let file = File::create(path)?;
    let mut tar = ustar::Writer::new(BufWriter::with_capacity(1 << 20, file));
    small_file(&mut tar, "oci-layout", oci::LAYOUT.as_bytes())?;
    for dir in ["blobs/", "blobs/sha256/"] {
        tar.header(&header(dir, &Kind::Dir { mode: 0o755 })?)?;
    }

    let size = layer.size();
    let name = blob_name(&layer_desc.digest);
    tar.header(&header(&name, &Kind::File { mode: 0o644, size })?)?;
    let start = tar.written();
    layer.write_to(&mut tar)?;
    if tar.written() - start != size {
        return Err(std::io::Error::other(
            "layer size differs from its computed size",
        ));
    }
    tar.pad(size)?;

    for (digest, blob) in blobs {
        small_file(&mut tar, &blob_name(digest), blob)?;
    }
    small_file(&mut tar, "index.json", index)?;
    tar.finish()?
        .into_inner()
        .map_err(|e| e.into_error())?
        .sync_all()
}

fn small_file<W: Write>(
    tar: &mut ustar::Writer<W>,
    name: &str,
    data: &[u8],
) -> std::io::Result<()> {
    let size = data.len() as u64;
    tar.header(&header(name, &Kind::File { mode: 0o644, size })?)?;
    tar.content(data)?;
    tar.pad(size)
}

fn header(name: &str, kind: &Kind) -> std::io::Result<[u8; 512]> {
    ustar::header(name, kind, 0, 0).map_err(|e| std::io::Error::other(e.reason()))
}

fn blob_name(digest: &str) -> String {
    format!("blobs/sha256/{}", digest.trim_start_matches("sha256:"))
}
