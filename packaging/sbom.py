#!/usr/bin/env python3
"""The gateway's software bill of materials (CycloneDX 1.5, JSON): every crate linked into the
binary (as the binary's own embedded list names them, with licence, purl and the checksum
Cargo.lock pins) and every system library the binary loads (as `ldd` names them), with
the Debian package and version that installed it. Shipped in the Debian package and the image
(docs/deploy.md "Supply chain"); reproducible: its timestamp is the commit's. The crates are
the ones the binary says it links: the dependency list `cargo auditable` embedded in it (its
`.dep-v0` section, which `cargo audit bin` and image scanners read), so a binary built without it
gets no SBOM.

    packaging/sbom.py target/release/domain-risk-gateway OUT.json
    packaging/sbom.py --audit BINARY     the crates BINARY's embedded list names, a line each
                                         (exits 1 when the binary carries none)
"""

import datetime
import json
import os
import subprocess
import sys
import tempfile
import tomllib
import zlib
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET = "x86_64-unknown-linux-gnu"


def run(*args, **kw):
    return subprocess.run(args, capture_output=True, text=True, check=True, **kw).stdout


def crates():
    """The packages the gateway links: its normal dependencies, transitively, for Linux."""
    meta = json.loads(run("cargo", "metadata", "--format-version", "1", "--locked", "--offline",
                          "--filter-platform", TARGET, cwd=ROOT))
    packages = {p["id"]: p for p in meta["packages"]}
    nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
    root = meta["resolve"]["root"]
    seen, todo = set(), [root]
    while todo:
        node = nodes[todo.pop()]
        for dep in node["deps"]:
            normal = any(k["kind"] is None for k in dep["dep_kinds"])
            if normal and dep["pkg"] not in seen:
                seen.add(dep["pkg"])
                todo.append(dep["pkg"])
    return packages[root], sorted((packages[i] for i in seen), key=lambda p: (p["name"], p["version"]))


def audit_data(binary):
    """The dependency list `cargo auditable` linked into BINARY: its `.dep-v0` section, zlib-
    compressed JSON ({"packages": [{"name", "version", "source", "kind"?, "root"?, ...}]}), or
    None when the binary carries none (built by a plain `cargo build`)."""
    with tempfile.TemporaryDirectory(prefix="drg-audit-") as tmp:
        section, scratch = Path(tmp, "dep-v0"), Path(tmp, "copy")
        dumped = subprocess.run(["objcopy", "--dump-section", f".dep-v0={section}", str(binary), str(scratch)],
                                capture_output=True, text=True)
        if dumped.returncode != 0 or not section.exists():
            return None
        return json.loads(zlib.decompress(section.read_bytes()))


def linked_crates(binary):
    """(name, version) of every crate the binary's embedded list names as linked at run time (the
    build-only ones, such as build scripts' dependencies, are not in the binary), without the
    gateway itself."""
    data = audit_data(binary)
    if data is None:
        sys.exit(f"sbom: {binary} carries no dependency list (.dep-v0): build it with `cargo auditable`")
    return sorted((p["name"], p["version"]) for p in data["packages"]
                  if p.get("kind", "runtime") == "runtime" and not p.get("root"))


def crate_component(p):
    c = {
        "type": "library",
        "bom-ref": f"pkg:cargo/{p['name']}@{p['version']}",
        "name": p["name"],
        "version": p["version"],
        "purl": f"pkg:cargo/{p['name']}@{p['version']}",
    }
    if p.get("license"):
        c["licenses"] = [{"expression": p["license"]}]
    return c


def system_libraries(binary):
    """(path, package, version, arch) of each library `ldd` names, from dpkg's database."""
    out = []
    for line in run("ldd", str(binary)).splitlines():
        parts = line.split()
        path = next((p for p in parts if p.startswith("/")), None)
        if not path:
            continue
        owner = None
        for candidate in (path, os.path.realpath(path), "/usr" + path if not path.startswith("/usr") else path):
            found = subprocess.run(["dpkg", "-S", candidate], capture_output=True, text=True)
            if found.returncode == 0:
                owner = found.stdout.split(":")[0].strip()
                break
        if not owner:
            sys.exit(f"sbom: no Debian package owns {path}")
        version, arch = run("dpkg-query", "-W", "-f", "${Version} ${Architecture}", owner).split()
        out.append((path, owner, version, arch))
    return out


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--audit":
        for name, version in linked_crates(Path(sys.argv[2])):
            print(f"{name} {version}")
        return
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    binary, dest = Path(sys.argv[1]), Path(sys.argv[2])
    root, linked = crates()
    # The document describes this binary: the crates its own embedded list names (what is linked
    # into it; proc-macros and build-only crates are not), each found in the lock's graph.
    embedded = set(linked_crates(binary))
    unknown = embedded - {(p["name"], p["version"]) for p in linked}
    if unknown:
        sys.exit(f"sbom: {binary} embeds crates this checkout's Cargo.lock does not link: {sorted(unknown)[:10]}")
    linked = [p for p in linked if (p["name"], p["version"]) in embedded]
    lock = tomllib.loads((ROOT / "Cargo.lock").read_text())
    sums = {(p["name"], p["version"]): p.get("checksum") for p in lock["package"]}
    components = []
    for p in linked:
        c = crate_component(p)
        checksum = sums.get((p["name"], p["version"]))
        if checksum:
            c["hashes"] = [{"alg": "SHA-256", "content": checksum}]
        components.append(c)
    libs = {}
    for path, pkg, version, arch in system_libraries(binary):
        ref = f"pkg:deb/debian/{pkg}@{version}?arch={arch}"
        lib = libs.setdefault(ref, {
            "type": "library",
            "bom-ref": ref,
            "name": pkg,
            "version": version,
            "purl": ref,
            "properties": [],
        })
        lib["properties"].append({"name": "file", "value": path})
    components.extend(libs.values())
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH") or run("git", "log", "-1", "--format=%ct", cwd=ROOT).strip() or 0)
    created = datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    revision = run("git", "rev-parse", "HEAD", cwd=ROOT).strip()
    main_ref = f"pkg:cargo/{root['name']}@{root['version']}"
    bom = {
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        # Stable for one commit: the same build gives the same document.
        "serialNumber": f"urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, 'domain-risk-gateway:' + revision)}",
        "version": 1,
        "metadata": {
            "timestamp": created,
            "tools": [{"name": "packaging/sbom.py", "version": revision[:12]}],
            "component": {
                "type": "application",
                "bom-ref": main_ref,
                "name": root["name"],
                "version": root["version"],
                "purl": main_ref,
                "licenses": [{"expression": root.get("license") or "NOASSERTION"}],
                "properties": [{"name": "git-revision", "value": revision}],
            },
        },
        "components": components,
        "dependencies": [{"ref": main_ref, "dependsOn": [c["bom-ref"] for c in components]}],
    }
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(bom, indent=1, sort_keys=True) + "\n")
    print(f"sbom: {dest}: {len(linked)} crates, {len(libs)} Debian packages")


if __name__ == "__main__":
    main()
