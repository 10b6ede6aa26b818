#!/usr/bin/env python3
"""Builds the container image as an OCI image layout and archive, with no daemon and no base
image: one layer holding the binary, exactly the shared libraries it links (as `ldd` names them)
with their Debian packages' dpkg records, the SBOM, the CA certificates, the shipped data, config
and (empty) keys file, a passwd entry for the service user and the state folder it owns.

The root file system is staged in a folder; GNU tar makes the layer (sorted, numeric owners, file
times the commit's) and umoci writes the image around it (blobs, config, manifest, index), so the
same commit gives the same image digest.

    packaging/image/build.py --binary PATH --config FILE --tag NAME:TAG --out DIR
    packaging/image/build.py --check DIR     unpack the layer and run the image's own command in
                                             a chroot as its user until a lookup answers

scripts/image is the entry point (docs/deploy.md "The container image").
"""
import argparse
import datetime
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
UID = GID = 10001
USER = "domain-risk-gateway"
CONF_DIR = "etc/domain-risk-gateway"
DATA_DIR = "usr/share/domain-risk-gateway/data"
STATE_DIR = "var/lib/domain-risk-gateway"
PUBLIC_PORT, ADMIN_PORT = 8080, 9180
# What an image's health check runs (Docker's HEALTHCHECK is not part of an OCI image config, so
# the compose file and `docker run --health-cmd` carry it): the binary asking its own public
# listener for /healthz (the image has no shell and no curl).
HEALTH = ["/usr/bin/domain-risk-gateway", "-c", f"/{CONF_DIR}/gateway.yaml", "health"]


def run(*args, **kw):
    return subprocess.run(args, capture_output=True, text=True, check=True, **kw).stdout


def libraries(binary):
    """The shared libraries `binary` loads, with the dynamic loader: (path in the image, file)."""
    libs = []
    for line in run("ldd", str(binary)).splitlines():
        line = line.strip()
        if "=>" in line:
            path = line.split("=>")[1].split("(")[0].strip()
        elif line.startswith("/"):
            path = line.split("(")[0].strip()
        else:
            continue  # linux-vdso: the kernel's
        if not path or path == "not found":
            sys.exit(f"image: {binary} needs a library ldd cannot find: {line}")
        libs.append(path)
    return libs


class Rootfs:
    """The image's root file system, staged in a folder (modes set here, never the umask's)."""

    def __init__(self, path):
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        self.path = path

    def dir(self, name, mode=0o755):
        d = self.path
        for part in name.strip("/").split("/"):
            d = d / part
            if not d.exists():
                d.mkdir()
                d.chmod(0o755)
        d.chmod(mode)

    def file(self, name, data, mode=0o644):
        self.dir(os.path.dirname(name))
        f = self.path / name
        f.write_bytes(data)
        f.chmod(mode)


def debian_packages(sbom):
    """The Debian packages an SBOM names (`pkg:deb/debian/<name>@...`)."""
    return sorted({c["name"] for c in sbom["components"] if c["purl"].startswith("pkg:deb/")})


def stage(args, rootfs):
    """Everything the image holds, in the staging folder."""
    rootfs.dir("tmp", 0o1777)
    rootfs.file("usr/bin/domain-risk-gateway", Path(args.binary).read_bytes(), 0o755)
    for lib in libraries(args.binary):
        rootfs.file(lib.lstrip("/"), Path(os.path.realpath(lib)).read_bytes(), 0o755)
    # What scanners read: the SBOM (crates and Debian packages), and a dpkg record of each
    # Debian package a copied library came from (`var/lib/dpkg/status.d/`, as distroless images
    # carry them), so that glibc's version is seen.
    sbom = Path(tempfile.mkdtemp(prefix="drg-sbom-")) / "sbom.cdx.json"
    subprocess.run([sys.executable, str(ROOT / "packaging" / "sbom.py"), str(args.binary), str(sbom)],
                   check=True, cwd=ROOT)
    rootfs.file("usr/share/doc/domain-risk-gateway/sbom.cdx.json", sbom.read_bytes())
    for package in debian_packages(json.loads(sbom.read_text())):
        rootfs.file(f"var/lib/dpkg/status.d/{package}", run("dpkg-query", "-s", package).encode())
    shutil.rmtree(sbom.parent, ignore_errors=True)
    rootfs.file("etc/ssl/certs/ca-certificates.crt", Path("/etc/ssl/certs/ca-certificates.crt").read_bytes())
    rootfs.file("etc/passwd", f"root:x:0:0:root:/:/nonexistent\n{USER}:x:{UID}:{GID}::/{STATE_DIR}:/nonexistent\n".encode())
    rootfs.file("etc/group", f"root:x:0:\n{USER}:x:{GID}:\n".encode())
    rootfs.file("etc/nsswitch.conf", b"hosts: files dns\n")
    rootfs.file("etc/hosts", b"127.0.0.1 localhost\n::1 localhost\n")
    rootfs.file(f"{CONF_DIR}/gateway.yaml", Path(args.config).read_bytes())
    rootfs.file(f"{CONF_DIR}/keys.yaml", (ROOT / "packaging" / "deb" / "keys.yaml").read_bytes())
    data = ROOT / "data"
    for path in sorted(data.rglob("*")):
        rel = path.relative_to(data).as_posix()
        if path.is_dir():
            rootfs.dir(f"{DATA_DIR}/{rel}")
        else:
            rootfs.file(f"{DATA_DIR}/{rel}", path.read_bytes())
    for man in args.assets or []:
        man = Path(man)
        if man.name == "domain-risk-gateway.1":
            rootfs.file("usr/share/man/man1/domain-risk-gateway.1", man.read_bytes())
    for name in ("alerts.yml", "grafana-dashboard.json"):
        rootfs.file(f"usr/share/domain-risk-gateway/monitoring/{name}",
                    (ROOT / "packaging" / "monitoring" / name).read_bytes())
    rootfs.dir(STATE_DIR, 0o700)


def layer_tar(rootfs, dest, epoch):
    """The layer, by GNU tar: names sorted, every time the commit's, owned by root except the
    state folder (the service user's, so that a new named volume takes that owner)."""
    common = ["--format=posix", "--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime",
              f"--mtime=@{epoch}", "--numeric-owner", "-C", str(rootfs.path)]
    top = sorted(p.name for p in rootfs.path.iterdir())
    run("tar", "--create", "--file", str(dest), "--sort=name", "--owner=0", "--group=0",
        f"--exclude=./{STATE_DIR}", f"--exclude={STATE_DIR}", *common, *top)
    run("tar", "--append", "--file", str(dest), "--no-recursion", f"--owner={UID}", f"--group={GID}",
        *common, STATE_DIR)


def build(args):
    revision = run("git", "rev-parse", "HEAD", cwd=ROOT).strip() or "unknown"
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH") or run("git", "log", "-1", "--format=%ct", cwd=ROOT).strip() or 0)
    created = datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    name, tag = args.tag.rsplit(":", 1)
    out = Path(args.out)
    rootfs = Rootfs(out / "rootfs")
    stage(args, rootfs)
    layer = out / "layer.tar"
    layer_tar(rootfs, layer, epoch)

    shutil.rmtree(out / "oci", ignore_errors=True)
    image = f"{out / 'oci'}:{tag}"
    labels = {
        "org.opencontainers.image.title": "domain-risk-gateway",
        "org.opencontainers.image.description": "Pingora gateway for domain-risk lookups, guarding an email-check backend",
        "org.opencontainers.image.version": tag,
        "org.opencontainers.image.revision": revision,
        "org.opencontainers.image.licenses": "Apache-2.0",
        "org.opencontainers.image.source": args.source,
        "org.opencontainers.image.created": created,
    }
    run("umoci", "init", "--layout", str(out / "oci"))
    run("umoci", "new", "--image", image)
    run("umoci", "raw", "add-layer", "--image", image, "--history.created", created,
        "--history.created_by", "scripts/image (packaging/image/build.py)", str(layer))
    config = ["umoci", "config", "--image", image, "--no-history", "--created", created,
              "--architecture", "amd64", "--os", "linux", "--config.user", f"{UID}:{GID}",
              "--config.env", "PATH=/usr/bin", "--config.env", "RUST_LOG=info",
              "--config.cmd", "serve", "--config.workingdir", f"/{STATE_DIR}",
              "--config.exposedports", f"{PUBLIC_PORT}/tcp", "--config.exposedports", f"{ADMIN_PORT}/tcp",
              "--config.volume", f"/{STATE_DIR}", "--config.stopsignal", "SIGTERM"]
    for word in ["/usr/bin/domain-risk-gateway", "-c", f"/{CONF_DIR}/gateway.yaml"]:
        config += ["--config.entrypoint", word]
    for key, value in labels.items():
        config += ["--config.label", f"{key}={value}", "--manifest.annotation", f"{key}={value}"]
    run(*config)
    run("umoci", "gc", "--layout", str(out / "oci"))
    os.remove(layer)
    shutil.rmtree(rootfs.path)

    archive = out / f"domain-risk-gateway-{tag}.oci.tar"
    run("tar", "--create", "--file", str(archive), "--sort=name", "--format=posix",
        "--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime", f"--mtime=@{epoch}",
        "--owner=0", "--group=0", "--numeric-owner", "-C", str(out / "oci"), "blobs", "index.json", "oci-layout")
    index = json.loads((out / "oci" / "index.json").read_text())
    manifest = index["manifests"][0]
    print(f"image {name}:{tag}: manifest {manifest['digest'][:19]} (umoci {run('umoci', '--version').split()[-1]})")
    print(f"  {out / 'oci'} (OCI layout), {archive} (`podman load -i` / `skopeo copy oci-archive:...`)")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def check(args):
    """Unpacks the image's layer into a folder and runs the image's own entrypoint and command
    there (chroot, as the image's user): the root file system alone must answer a lookup."""
    oci = Path(args.check) / "oci"
    index = json.loads((oci / "index.json").read_text())
    read = lambda d: (oci / "blobs" / "sha256" / d.split(":")[1]).read_bytes()
    manifest = json.loads(read(index["manifests"][0]["digest"]))
    config = json.loads(read(manifest["config"]["digest"]))["config"]
    assert config["User"] == f"{UID}:{GID}", config["User"]
    assert set(config["ExposedPorts"]) == {f"{PUBLIC_PORT}/tcp", f"{ADMIN_PORT}/tcp"}
    for label in ("source", "version", "licenses", "revision"):
        assert config["Labels"].get(f"org.opencontainers.image.{label}"), label
    root = Path(tempfile.mkdtemp(prefix="drg-image-root-"))
    root.chmod(0o755)  # the image's `/`, as a runtime makes it
    try:
        layer = manifest["layers"][0]["digest"]
        with tarfile.open(fileobj=io.BytesIO(gzip.decompress(read(layer)))) as t:
            try:
                t.extractall(root, numeric_owner=True, filter="fully_trusted")
            except TypeError:  # a Python without extraction filters
                t.extractall(root, numeric_owner=True)
        # What an operator mounts: a key, and the listeners on ports free on this machine.
        secret = "drg_image_check_key_0123456789abcdefghijklmnopqr"
        digest = hashlib.sha256(secret.encode()).hexdigest()
        keys = root / CONF_DIR / "keys.yaml"
        keys.write_text(f"keys:\n  - id: image-check\n    sha256: {digest}\n    plan: free\n")
        os.chown(keys, UID, GID)
        port, admin = free_port(), free_port()
        conf = root / CONF_DIR / "gateway.yaml"
        text = conf.read_text()
        text = re.sub(rf"listen: 0\.0\.0\.0:{PUBLIC_PORT}", f"listen: 127.0.0.1:{port}", text, count=1)
        text = re.sub(rf"listen: 0\.0\.0\.0:{ADMIN_PORT}", f"listen: 127.0.0.1:{admin}", text, count=1)
        conf.write_text(text)
        command = config["Entrypoint"] + config["Cmd"]
        chroot_bin = shutil.which("chroot") or sys.exit("image check: chroot is missing (coreutils)")
        chroot = [chroot_bin, f"--userspec={UID}:{GID}", str(root)]
        env = {k: v for k, v in (e.split("=", 1) for e in config["Env"])}
        log = open(root / "tmp" / "check.log", "w")
        proc = subprocess.Popen(chroot + command, env=env,
                                stdout=log, stderr=log, cwd="/")
        body = ""
        try:
            for _ in range(150):
                if proc.poll() is not None:
                    break
                try:
                    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/public/domain/mailinator.com",
                                                 headers={"Authorization": f"Bearer {secret}"})
                    body = urllib.request.urlopen(req, timeout=2).read().decode()
                    break
                except OSError:
                    time.sleep(0.2)
            health = subprocess.run(chroot + HEALTH, env=env,
                                    capture_output=True, text=True)
        finally:
            proc.terminate()
            proc.wait(timeout=15)
        output = (root / "tmp" / "check.log").read_text()
        if '"reason":"disposable"' not in body:
            sys.exit(f"image check: no answer from the unpacked image ({body!r}):\n{output}")
        if health.returncode != 0:
            sys.exit(f"image check: its health check failed: {health.stdout}{health.stderr}")
        sbom = json.loads((root / "usr/share/doc/domain-risk-gateway/sbom.cdx.json").read_text())
        packages = debian_packages(sbom)
        crates = sum(1 for c in sbom["components"] if c["purl"].startswith("pkg:cargo/"))
        if "libc6" not in packages or crates < 100:
            sys.exit(f"image check: the SBOM names {crates} crates and {packages}")
        for package in packages:
            record = (root / "var/lib/dpkg/status.d" / package).read_text()
            if f"Package: {package}" not in record or "Version: " not in record:
                sys.exit(f"image check: no dpkg record of {package}")
        print(f"image check: SBOM with {crates} crates and Debian packages {', '.join(packages)} "
              f"(each with its dpkg record)")
        # The binary's own dependency list (cargo auditable), as `cargo audit bin` and scanners
        # read it from the layer; the SBOM names the same crates (packaging/sbom.py checks that).
        audited = run(sys.executable, str(ROOT / "packaging" / "sbom.py"), "--audit",
                      str(root / "usr/bin/domain-risk-gateway")).splitlines()
        if len(audited) != crates:
            sys.exit(f"image check: the binary lists {len(audited)} crates, the SBOM {crates}")
        print(f"image check: the binary lists its {len(audited)} crates (cargo auditable)")
        state = list((root / STATE_DIR).iterdir())
        if not state:
            sys.exit("image check: nothing written to the state volume")
        print(f"image check: the unpacked root answered as uid {UID}: {body}")
        print(f"image check: health check: {health.stdout.strip()}; state written: "
              f"{', '.join(sorted(p.name for p in state))}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary")
    ap.add_argument("--config")
    ap.add_argument("--tag")
    ap.add_argument("--out")
    ap.add_argument("--source", default="")
    ap.add_argument("--assets", nargs="*")
    ap.add_argument("--check")
    args = ap.parse_args()
    if args.check:
        return check(args)
    build(args)


if __name__ == "__main__":
    main()
