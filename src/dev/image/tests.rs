//! Unit tests: the test binary itself stands in for the envbridge executable.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::*;

fn exe() -> PathBuf {
    std::env::current_exe().expect("test executable")
}

/// One member of a tar file, as read back by this test's own small ustar reader.
#[derive(Debug)]
struct Member {
    name: String,
    flag: u8,
    mode: u32,
    uid: u32,
    mtime: u64,
    link: String,
    data: Vec<u8>,
}

fn field(h: &[u8]) -> String {
    let end = h.iter().position(|&b| b == 0).unwrap_or(h.len());
    String::from_utf8(h[..end].to_vec()).unwrap()
}

fn octal(h: &[u8]) -> u64 {
    u64::from_str_radix(field(h).trim(), 8).unwrap()
}

fn read_tar(bytes: &[u8]) -> Vec<Member> {
    let mut members = Vec::new();
    let mut at = 0;
    loop {
        let h = &bytes[at..at + 512];
        if h.iter().all(|&b| b == 0) {
            assert!(bytes[at + 512..at + 1024].iter().all(|&b| b == 0));
            assert_eq!(bytes.len(), at + 1024, "nothing after the end blocks");
            return members;
        }
        let mut blank = h.to_vec();
        blank[148..156].fill(b' ');
        let sum: u64 = blank.iter().map(|&b| u64::from(b)).sum();
        assert_eq!(octal(&h[148..156]), sum, "checksum of header at {at}");
        assert_eq!(&h[257..265], b"ustar\x0000");
        let prefix = field(&h[345..500]);
        let base = field(&h[..100]);
        let size = octal(&h[124..136]) as usize;
        let start = at + 512;
        members.push(Member {
            name: if prefix.is_empty() {
                base
            } else {
                format!("{prefix}/{base}")
            },
            flag: h[156],
            mode: octal(&h[100..108]) as u32,
            uid: octal(&h[108..116]) as u32,
            mtime: octal(&h[136..148]),
            link: field(&h[157..257]),
            data: bytes[start..start + size].to_vec(),
        });
        at = start + size.div_ceil(512) * 512;
    }
}

fn find<'a>(members: &'a [Member], name: &str) -> &'a Member {
    members
        .iter()
        .find(|m| m.name == name)
        .unwrap_or_else(|| panic!("{name} is not in the tar"))
}

fn blob<'a>(outer: &'a [Member], digest: &str) -> &'a [u8] {
    let hex = digest.strip_prefix("sha256:").unwrap();
    &find(outer, &format!("blobs/sha256/{hex}")).data
}

fn json_blob(outer: &[Member], digest: &str) -> Value {
    serde_json::from_slice(blob(outer, digest)).unwrap()
}

#[test]
fn the_same_executable_gives_byte_identical_archives() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let first = build(&exe(), a.path()).unwrap();
    let second = build(&exe(), b.path()).unwrap();
    assert_eq!(first.manifests, second.manifests);
    let digest = |p: &Path| blake3::hash(&std::fs::read(p).unwrap());
    assert_eq!(digest(&first.path), digest(&second.path));
    // Entries in another order still give the same layer.
    let mut entries = rootfs_entries(&exe()).unwrap();
    entries.reverse();
    let spec = ImageSpec {
        reference: IMAGE.into(),
        entrypoint: vec![ENVBRIDGE.into()],
        cmd: vec![],
        labels: BTreeMap::new(),
    };
    let out = a.path().join("reversed.tar");
    let reversed = write_oci_archive(&entries, &out, std::slice::from_ref(&spec)).unwrap();
    let sorted = write_oci_archive(
        &rootfs_entries(&exe()).unwrap(),
        &b.path().join("sorted.tar"),
        &[spec],
    )
    .unwrap();
    assert_eq!(reversed.manifests, sorted.manifests);
}

#[test]
fn the_archive_holds_both_images_over_one_shared_layer() {
    let dir = tempfile::tempdir().unwrap();
    let archive = build(&exe(), dir.path()).unwrap();
    assert_eq!(archive.path, dir.path().join(ARCHIVE_FILE));
    let refs: Vec<&str> = archive.manifests.iter().map(|(r, _)| r.as_str()).collect();
    assert_eq!(refs, [IMAGE, PAUSE_IMAGE]);

    let outer = read_tar(&std::fs::read(&archive.path).unwrap());
    assert_eq!(
        find(&outer, "oci-layout").data,
        br#"{"imageLayoutVersion":"1.0.0"}"#
    );
    let index: Value = serde_json::from_slice(&find(&outer, "index.json").data).unwrap();
    assert_eq!(index["schemaVersion"], 2);
    let listed = index["manifests"].as_array().unwrap();
    assert_eq!(listed.len(), 2);
    let exe_bytes = std::fs::read(exe()).unwrap();
    let build_hash = blake3::hash(&exe_bytes).to_hex().to_string();

    let mut layer_digests = Vec::new();
    for ((reference, digest), desc) in archive.manifests.iter().zip(listed) {
        assert_eq!(&desc["digest"], digest);
        assert_eq!(desc["mediaType"], oci::MEDIA_MANIFEST);
        assert_eq!(desc["annotations"]["io.containerd.image.name"], *reference);
        assert_eq!(
            desc["annotations"]["org.opencontainers.image.ref.name"],
            *reference
        );
        assert_eq!(desc["platform"]["os"], "linux");
        assert_eq!(desc["size"], blob(&outer, digest).len());
        assert_eq!(oci::sha256(blob(&outer, digest)), *digest);

        let manifest = json_blob(&outer, digest);
        assert_eq!(manifest["schemaVersion"], 2);
        assert_eq!(manifest["mediaType"], oci::MEDIA_MANIFEST);
        let layer = &manifest["layers"][0];
        assert_eq!(layer["mediaType"], oci::MEDIA_LAYER);
        let layer_digest = layer["digest"].as_str().unwrap().to_string();
        let config_digest = manifest["config"]["digest"].as_str().unwrap();
        let config = json_blob(&outer, config_digest);
        assert_eq!(config["os"], "linux");
        assert_eq!(config["architecture"], oci::Platform::host().architecture);
        assert_eq!(
            config["rootfs"]["diff_ids"],
            serde_json::json!([layer_digest])
        );
        assert_eq!(config["config"]["Env"], serde_json::json!([PATH_ENV]));
        assert_eq!(config["config"]["Labels"][BUILD_LABEL], build_hash);
        let entrypoint = if reference == IMAGE {
            serde_json::json!([ENVBRIDGE])
        } else {
            serde_json::json!([ENVBRIDGE, "pause"])
        };
        assert_eq!(config["config"]["Entrypoint"], entrypoint);
        let layer_blob = blob(&outer, &layer_digest);
        assert_eq!(
            oci::sha256(layer_blob),
            layer_digest,
            "diff_id is the layer's sha256"
        );
        assert_eq!(layer["size"], layer_blob.len());
        layer_digests.push(layer_digest);
    }
    assert_eq!(
        layer_digests[0], layer_digests[1],
        "one layer for both images"
    );
    let blobs = outer
        .iter()
        .filter(|m| m.name.starts_with("blobs/sha256/") && m.flag == b'0');
    assert_eq!(
        blobs.count(),
        5,
        "the layer once, a config and a manifest per image"
    );

    let layer = read_tar(blob(&outer, &layer_digests[0]));
    let names: Vec<&str> = layer.iter().map(|m| m.name.as_str()).collect();
    let mut sorted = names.clone();
    sorted.sort_by_key(|n| n.trim_end_matches('/'));
    assert_eq!(names, sorted, "entries are in path order");
    assert!(layer.iter().all(|m| m.mtime == 0));
    assert!(layer.iter().all(|m| m.uid == 0 || m.name == "home/flp/"));

    let envbridge = find(&layer, "usr/local/bin/envbridge");
    assert_eq!((envbridge.flag, envbridge.mode), (b'0', 0o755));
    assert!(envbridge.data == exe_bytes, "the executable's bytes");
    assert_eq!(find(&layer, "bin/bash").flag, b'0');
    assert!(find(&layer, "bin/bash").data.starts_with(b"\x7fELF"));
    assert_eq!(find(&layer, "bin/sh").link, "bash");
    for tool in ["usr/bin/tee", "bin/cat", "bin/sleep", "usr/bin/env"] {
        assert!(find(&layer, tool).data.starts_with(b"\x7fELF"), "{tool}");
    }
    // Whatever ldd names (the loader, libc, ...) is in the layer with content.
    let needed = ldd::libraries(&exe()).unwrap();
    let loader = needed
        .iter()
        .find(|l| l.contains("/ld-"))
        .expect("a loader");
    assert!(find(&layer, &loader[1..]).data.starts_with(b"\x7fELF"));
    for library in &needed {
        assert!(
            find(&layer, &library[1..]).data.starts_with(b"\x7fELF"),
            "{library}"
        );
    }
    for command in ANCHOR_COMMANDS {
        let link = find(&layer, &format!("opt/o2/bin/{command}"));
        assert_eq!((link.flag, link.link.as_str()), (b'2', ENVBRIDGE));
    }
    assert_eq!(find(&layer, "opt/o2/bin/StfBuilder").link, ENVBRIDGE);
    assert_eq!(
        (find(&layer, "tmp/").flag, find(&layer, "tmp/").mode),
        (b'5', 0o1777)
    );
    for dir in [
        "dev/shm/",
        "etc/",
        "var/log/",
        "proc/",
        "sys/",
        "dev/",
        "opt/o2/bin/",
    ] {
        assert_eq!(find(&layer, dir).flag, b'5', "{dir}");
    }
    let passwd = String::from_utf8(find(&layer, "etc/passwd").data.clone()).unwrap();
    assert!(passwd.contains("flp:x:1100:1100:flp:/home/flp:/bin/bash"));
    assert!(String::from_utf8_lossy(&find(&layer, "etc/group").data).contains("flp:x:1100:"));
    assert_eq!(find(&layer, "home/flp/").uid, FLP_UID);
}

#[test]
fn gnu_tar_reads_the_archive_and_its_layer() {
    let dir = tempfile::tempdir().unwrap();
    let archive = build(&exe(), dir.path()).unwrap();
    let out = dir.path().join("x");
    std::fs::create_dir(&out).unwrap();
    let tar = |args: &[&str], cwd: &Path| {
        let o = std::process::Command::new("tar")
            .args(args)
            .current_dir(cwd)
            .output()
            .expect("GNU tar on this machine");
        assert!(
            o.status.success(),
            "tar {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8(o.stdout).unwrap()
    };
    tar(&["-xf", archive.path.to_str().unwrap()], &out);
    let index: Value =
        serde_json::from_slice(&std::fs::read(out.join("index.json")).unwrap()).unwrap();
    let manifest: Value = {
        let digest = index["manifests"][0]["digest"].as_str().unwrap();
        let path = out.join("blobs/sha256").join(&digest[7..]);
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
    };
    let layer = out
        .join("blobs/sha256")
        .join(&manifest["layers"][0]["digest"].as_str().unwrap()[7..]);
    let listing = tar(&["-tvf", layer.to_str().unwrap()], &out);
    assert!(listing.contains("opt/o2/bin/StfBuilder -> /usr/local/bin/envbridge"));
    assert!(listing.contains("drwxrwxrwt 0/0               0 1970-01-01 00:00 tmp/"));
}

#[test]
fn ldd_output_parses_to_paths() {
    let out = "\tlinux-vdso.so.1 (0x00007ffd6b5f2000)\n\
        \tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007f1c0a7c0000)\n\
        \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f1c0a400000)\n\
        \t/lib64/ld-linux-x86-64.so.2 (0x00007f1c0b2a0000)\n";
    assert_eq!(
        ldd::parse(out).unwrap(),
        [
            "/lib/x86_64-linux-gnu/libgcc_s.so.1",
            "/lib/x86_64-linux-gnu/libc.so.6",
            "/lib64/ld-linux-x86-64.so.2"
        ]
    );
    assert_eq!(
        ldd::parse("\tlinux-gate.so.1 =>  (0x00007fff)\n").unwrap(),
        Vec::<String>::new()
    );
    assert_eq!(
        ldd::parse("\tlibfoo.so.1 => not found\n"),
        Err(ldd::Unparsed::Missing("libfoo.so.1".into()))
    );
    assert!(matches!(
        ldd::parse("\twhat is this\n"),
        Err(ldd::Unparsed::Line(_))
    ));
}

#[test]
fn long_paths_split_into_prefix_and_name() {
    let dir = "a".repeat(120);
    let name = format!("{dir}/file");
    let h = ustar::header(
        &name,
        &ustar::Kind::File {
            mode: 0o644,
            size: 3,
        },
        0,
        0,
    )
    .unwrap();
    assert_eq!(field(&h[345..500]), dir);
    assert_eq!(field(&h[..100]), "file");
    let tail = "b".repeat(101);
    assert_eq!(
        ustar::header(&tail, &ustar::Kind::Dir { mode: 0o755 }, 0, 0),
        Err(ustar::HeaderError::NameTooLong)
    );
}

#[test]
fn bad_entries_and_specs_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("a.tar");
    let spec = |reference: &str| ImageSpec {
        reference: reference.into(),
        entrypoint: vec!["/x".into()],
        cmd: vec![],
        labels: BTreeMap::new(),
    };
    let ok = [Entry::file("/x", 0o755, b"x".to_vec())];
    let err = |entries: &[Entry], specs: &[ImageSpec]| {
        write_oci_archive(entries, &out, specs)
            .unwrap_err()
            .to_string()
    };
    assert!(err(&[Entry::dir("etc", 0o755)], &[spec(IMAGE)]).contains("not absolute"));
    assert!(err(&[Entry::dir("/a/../b", 0o755)], &[spec(IMAGE)]).contains("component"));
    let twice = [Entry::dir("/a", 0o755), Entry::dir("/a", 0o700)];
    assert!(err(&twice, &[spec(IMAGE)]).contains("more than once"));
    assert!(err(&ok, &[spec("envbridge")]).contains("full reference"));
    assert!(err(&ok, &[spec(IMAGE), spec(IMAGE)]).contains("named twice"));
    assert!(!out.exists(), "nothing is written for a refused archive");
    let archive = write_oci_archive(&ok, &out, &[spec(IMAGE)]).unwrap();
    assert_eq!(
        archive.digest_of(IMAGE),
        Some(archive.manifests[0].1.as_str())
    );
}

#[test]
fn ctr_images_ls_gives_the_digest_of_the_exact_reference() {
    let out = "REF                            TYPE                                    DIGEST                                                                  SIZE     PLATFORMS   LABELS \n\
        localhost/envbridge-pause:dev  application/vnd.oci.image.manifest.v1+json sha256:1111 12.0 MiB linux/amd64 - \n\
        localhost/envbridge:dev        application/vnd.oci.image.manifest.v1+json sha256:2222 12.0 MiB linux/amd64 - \n";
    assert_eq!(import::parse_ls(out, IMAGE).as_deref(), Some("sha256:2222"));
    assert_eq!(
        import::parse_ls(out, PAUSE_IMAGE).as_deref(),
        Some("sha256:1111")
    );
    assert_eq!(import::parse_ls(out, "localhost/other:dev"), None);
    assert_eq!(
        import::parse_ls("REF TYPE DIGEST SIZE PLATFORMS LABELS\n", IMAGE),
        None
    );
}

#[test]
fn ctr_errors_quote_stderr_without_its_log_warnings() {
    let stderr = "time=\"2026-12-02T13:54:06Z\" level=warning msg=\"DEPRECATION: cgroup v1\"\n\
        ctr: open /nonexistent.tar: no such file or directory\n";
    assert_eq!(
        import::quoted_stderr(stderr),
        "ctr: open /nonexistent.tar: no such file or directory"
    );
    let only = "time=x level=warning msg=y\n";
    assert_eq!(import::quoted_stderr(only), only.trim());
}

#[test]
fn manifest_files_are_copied_and_bounded() {
    let dir = tempfile::tempdir().unwrap();
    for (from, _) in MANIFEST_DIRS {
        std::fs::create_dir_all(dir.path().join(from)).unwrap();
    }
    std::fs::write(
        dir.path().join("site/local.yaml"),
        "o2_install_path: /opt/o2\n",
    )
    .unwrap();
    let entries = rootfs_entries_with(&exe(), Some(dir.path())).unwrap();
    assert!(
        entries
            .iter()
            .any(|e| e.path == "/etc/envbridge/site/local.yaml")
    );
    let big = vec![b'#'; 4 * 1024 * 1024 + 1];
    std::fs::write(dir.path().join("control-workflows/tasks/big.yaml"), big).unwrap();
    let e = rootfs_entries_with(&exe(), Some(dir.path()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("big.yaml") && e.contains("4 MiB"), "{e}");
}
