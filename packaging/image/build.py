#!/usr/bin/env python3
"""Builds the container image as an OCI image layout and archive, with no daemon and no base
image: one layer holding the binary, exactly the shared libraries it links (as `ldd` names them),
the CA certificates, the shipped data, config and (empty) keys file, a passwd entry for the
service user and the state folder it owns. Reproducible: fixed file times (the commit's), owners
and gzip header.

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


def libraries(binary):
    """The shared libraries `binary` loads, with the dynamic loader: (path in the image, file)."""
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True).stdout
    libs = []
    for line in out.splitlines():
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


class Layer:
    """A deterministic tar of the image's root file system."""

    def __init__(self, mtime):
        self.buf = io.BytesIO()
        self.tar = tarfile.open(fileobj=self.buf, mode="w", format=tarfile.PAX_FORMAT)
        self.mtime = mtime
        self.dirs = set()

    def _info(self, name, kind, mode, uid=0, gid=0):
        info = tarfile.TarInfo(name)
        info.type, info.mode, info.uid, info.gid, info.mtime = kind, mode, uid, gid, self.mtime
        info.uname = info.gname = ""
        return info

    def dir(self, name, mode=0o755, uid=0, gid=0):
        parts = name.strip("/").split("/")
        for i in range(1, len(parts) + 1):
            d = "/".join(parts[:i])
            if d in self.dirs:
                continue
            self.dirs.add(d)
            last = i == len(parts)
            self.tar.addfile(self._info(d, tarfile.DIRTYPE, mode if last else 0o755,
                                        uid if last else 0, gid if last else 0))

    def file(self, name, data, mode=0o644):
        self.dir(os.path.dirname(name))
        info = self._info(name, tarfile.REGTYPE, mode)
        info.size = len(data)
        self.tar.addfile(info, io.BytesIO(data))

    def symlink(self, name, target):
        self.dir(os.path.dirname(name))
        info = self._info(name, tarfile.SYMTYPE, 0o777)
        info.linkname = target
        self.tar.addfile(info)

    def close(self):
        self.tar.close()
        return self.buf.getvalue()


def debian_packages(sbom):
    """The Debian packages an SBOM names (`pkg:deb/debian/<name>@...`)."""
    return sorted({c["name"] for c in sbom["components"] if c["purl"].startswith("pkg:deb/")})


def build(args):
    revision = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True).stdout.strip() or "unknown"
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH") or subprocess.run(
        ["git", "log", "-1", "--format=%ct"], cwd=ROOT, capture_output=True, text=True).stdout.strip() or 0)
    created = datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    name, tag = args.tag.rsplit(":", 1)
    version = tag

    layer = Layer(epoch)
    layer.dir("tmp", 0o1777)
    layer.file("usr/bin/domain-risk-gateway", Path(args.binary).read_bytes(), 0o755)
    for lib in libraries(args.binary):
        real = os.path.realpath(lib)
        layer.file(lib.lstrip("/"), Path(real).read_bytes(), 0o755)
    # What scanners read: the SBOM (crates and Debian packages), and a dpkg record of each
    # Debian package a copied library came from (`var/lib/dpkg/status.d/`, as distroless images
    # carry them), so that glibc's version is seen.
    sbom = Path(tempfile.mkdtemp(prefix="drg-sbom-")) / "sbom.cdx.json"
    subprocess.run([sys.executable, str(ROOT / "packaging" / "sbom.py"), str(args.binary), str(sbom)],
                   check=True, cwd=ROOT)
    layer.file("usr/share/doc/domain-risk-gateway/sbom.cdx.json", sbom.read_bytes())
    for package in debian_packages(json.loads(sbom.read_text())):
        record = subprocess.run(["dpkg-query", "-s", package], capture_output=True, text=True,
                                check=True).stdout
        layer.file(f"var/lib/dpkg/status.d/{package}", record.encode())
    shutil.rmtree(sbom.parent, ignore_errors=True)
    layer.file("etc/ssl/certs/ca-certificates.crt", Path("/etc/ssl/certs/ca-certificates.crt").read_bytes())
    layer.file("etc/passwd", f"root:x:0:0:root:/:/nonexistent\n{USER}:x:{UID}:{GID}::/{STATE_DIR}:/nonexistent\n".encode())
    layer.file("etc/group", f"root:x:0:\n{USER}:x:{GID}:\n".encode())
    layer.file("etc/nsswitch.conf", b"hosts: files dns\n")
    layer.file("etc/hosts", b"127.0.0.1 localhost\n::1 localhost\n")
    layer.file(f"{CONF_DIR}/gateway.yaml", Path(args.config).read_bytes())
    layer.file(f"{CONF_DIR}/keys.yaml", (ROOT / "packaging" / "deb" / "keys.yaml").read_bytes())
    data = ROOT / "data"
    for path in sorted(data.rglob("*")):
        rel = path.relative_to(data).as_posix()
        if path.is_dir():
            layer.dir(f"{DATA_DIR}/{rel}")
        else:
            layer.file(f"{DATA_DIR}/{rel}", path.read_bytes())
    for man in args.assets or []:
        man = Path(man)
        if man.name == "domain-risk-gateway.1":
            layer.file("usr/share/man/man1/domain-risk-gateway.1", man.read_bytes())
    for name in ("alerts.yml", "grafana-dashboard.json"):
        layer.file(f"usr/share/domain-risk-gateway/monitoring/{name}",
                   (ROOT / "packaging" / "monitoring" / name).read_bytes())
    layer.dir(STATE_DIR, 0o700, UID, GID)
    tar = layer.close()

    gz = io.BytesIO()
    with gzip.GzipFile(fileobj=gz, mode="wb", mtime=0, compresslevel=9, filename="") as f:
        f.write(tar)
    gz = gz.getvalue()
    out = Path(args.out)
    shutil.rmtree(out / "oci", ignore_errors=True)
    blobs = out / "oci" / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def blob(data):
        digest = hashlib.sha256(data).hexdigest()
        (blobs / digest).write_bytes(data)
        return {"digest": f"sha256:{digest}", "size": len(data)}

    layer_desc = blob(gz)
    labels = {
        "org.opencontainers.image.title": "domain-risk-gateway",
        "org.opencontainers.image.description": "Pingora gateway for domain-risk lookups, guarding an email-check backend",
        "org.opencontainers.image.version": version,
        "org.opencontainers.image.revision": revision,
        "org.opencontainers.image.licenses": "Apache-2.0",
        "org.opencontainers.image.source": args.source,
        "org.opencontainers.image.created": created,
    }
    config = {
        "created": created,
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "User": f"{UID}:{GID}",
            "Env": ["PATH=/usr/bin", "RUST_LOG=info"],
            "Entrypoint": ["/usr/bin/domain-risk-gateway", "-c", f"/{CONF_DIR}/gateway.yaml"],
            "Cmd": ["serve"],
            "WorkingDir": f"/{STATE_DIR}",
            "ExposedPorts": {f"{PUBLIC_PORT}/tcp": {}, f"{ADMIN_PORT}/tcp": {}},
            "Volumes": {f"/{STATE_DIR}": {}},
            "StopSignal": "SIGTERM",
            "Labels": labels,
            # Docker's and Podman's health check (they read it from the image config): the
            # public listener's /healthz, asked by the binary itself (the image has no curl).
            "Healthcheck": {
                "Test": ["CMD", "/usr/bin/domain-risk-gateway", "-c", f"/{CONF_DIR}/gateway.yaml", "health"],
                "Interval": 10_000_000_000, "Timeout": 3_000_000_000, "Retries": 3,
                "StartPeriod": 10_000_000_000,
            },
        },
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(tar).hexdigest()}"]},
        "history": [{"created": created, "created_by": "packaging/image/build.py"}],
    }
    config_desc = blob(json.dumps(config, sort_keys=True, separators=(",", ":")).encode())
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config_desc},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **layer_desc}],
        "annotations": labels,
    }
    manifest_desc = blob(json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode())
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", **manifest_desc,
                       "annotations": {"org.opencontainers.image.ref.name": tag,
                                       "io.containerd.image.name": f"{name}:{tag}"}}],
    }
    (out / "oci" / "index.json").write_text(json.dumps(index, sort_keys=True, indent=1) + "\n")
    (out / "oci" / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}\n')
    archive = out / f"domain-risk-gateway-{version}.oci.tar"
    with tarfile.open(archive, "w", format=tarfile.PAX_FORMAT) as t:
        for path in sorted((out / "oci").rglob("*")):
            info = t.gettarinfo(path, path.relative_to(out / "oci").as_posix())
            info.mtime, info.uid, info.gid, info.uname, info.gname = epoch, 0, 0, "", ""
            if path.is_file():
                with open(path, "rb") as f:
                    t.addfile(info, f)
            else:
                t.addfile(info)
    print(f"image {name}:{tag}: layer {len(gz) / 1e6:.1f} MB compressed, {len(tar) / 1e6:.1f} MB unpacked, "
          f"manifest {manifest_desc['digest'][:19]}")
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
            health = subprocess.run(chroot + config["Healthcheck"]["Test"][1:], env=env,
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
