"""What `pip install torch==VERSION` downloads from PyPI on each platform a learner may have: the torch
wheel and the packages it pulls in there (on Linux x86_64, the CUDA build's NVIDIA libraries).

Reads PyPI's JSON API and each wheel's METADATA through HTTP range requests (only the zip's directory
and that one file travel, not the wheels), follows every Requires-Dist whose marker holds on the
platform, and adds up the wheels' sizes. A maintainer's tool for the README's install sentence:
    python scripts/torch_download_size.py            # torch 2.13.0 on Linux, macOS and Windows
    python scripts/torch_download_size.py --version 2.14.1 --json sizes.json
Needs the network and `packaging` (in the maintainer's .venv).
"""
import argparse
import io
import json
import urllib.request
import zipfile
from urllib.parse import urljoin

from packaging.requirements import Requirement
from packaging.utils import parse_wheel_filename
from packaging.version import InvalidVersion, Version

PYPI = "https://pypi.org/pypi/{}/json"
# platform name -> (wheel platform tags it accepts, the PEP 508 marker environment)
PLATFORMS = {
    "Linux x86_64": (("manylinux", "x86_64"), {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64"}),
    "Linux aarch64": (("manylinux", "aarch64"), {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "aarch64"}),
    "macOS arm64": (("macosx", "arm64"), {"sys_platform": "darwin", "platform_system": "Darwin", "platform_machine": "arm64"}),
    "Windows x86_64": (("win_amd64", ""), {"sys_platform": "win32", "platform_system": "Windows", "platform_machine": "AMD64"}),
}


class RangeFile(io.RawIOBase):
    """A remote file read by HTTP range requests, seekable, so that zipfile reads only what it needs."""

    def __init__(self, url: str, size: int):
        self.url, self.size, self.pos = url, size, 0

    def seekable(self):
        return True

    def readable(self):
        return True

    def tell(self):
        return self.pos

    def seek(self, offset, whence=io.SEEK_SET):
        self.pos = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence] + offset
        return self.pos

    def read(self, n=-1):
        end = self.size if n is None or n < 0 else min(self.size, self.pos + n)
        if end <= self.pos:
            return b""
        request = urllib.request.Request(self.url, headers={"Range": f"bytes={self.pos}-{end - 1}"})
        with urllib.request.urlopen(request, timeout=60) as response:
            data = response.read()
        self.pos += len(data)
        return data


def project(name: str, cache: dict) -> dict:
    if name not in cache:
        url = PYPI.format(name)
        with urllib.request.urlopen(url, timeout=60) as response:
            cache[name] = (url, json.load(response))
    return cache[name]


def releases(data: dict):
    """(version, files) of each release whose version string is a valid one (old uploads may not be)."""
    for text, files in data["releases"].items():
        try:
            yield Version(text), files
        except InvalidVersion:
            pass


def pick_wheel(name: str, spec, tags, python: str, cache: dict):
    """The newest release matching spec with a wheel for the platform and Python (or a pure one)."""
    url, data = project(name, cache)
    for version, files in sorted(releases(data), key=lambda release: release[0], reverse=True):
        if version.is_prerelease or (spec and version not in spec):
            continue
        for file in files:
            if not file["filename"].endswith(".whl") or file.get("yanked"):
                continue
            _, _, _, wheel_tags = parse_wheel_filename(file["filename"])
            for tag in wheel_tags:
                pure = tag.platform == "any"
                platform_ok = pure or (tags[0] in tag.platform and tags[1] in tag.platform)
                python_ok = tag.interpreter in (python, "py3") or tag.abi == "abi3"
                if platform_ok and python_ok:
                    return version, file, urljoin(url, file["url"])
    return None


def requirements(wheel_url: str, size: int) -> list[Requirement]:
    with zipfile.ZipFile(RangeFile(wheel_url, size)) as wheel:
        metadata = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
        text = wheel.read(metadata).decode("utf-8")
    return [Requirement(line.split(":", 1)[1].strip()) for line in text.splitlines()
            if line.startswith("Requires-Dist:")]


def download(version: str, platform: str, python: str, cache: dict) -> dict:
    """Resolves torch's dependencies for the platform as pip would for a new venv: each package's
    newest release that meets every requirement on it (extras followed), then adds up the wheels."""
    tags, env = PLATFORMS[platform]
    env = {**env, "python_version": python[2] + "." + python[3:]}
    specs, extras, picked = {}, {}, {}
    wanted = [Requirement(f"torch=={version}")]
    while wanted:
        req = wanted.pop(0)
        name = req.name.lower().replace("_", "-")
        specs[name] = specs.get(name, req.specifier) & req.specifier
        new_extras = set(req.extras) - extras.setdefault(name, set())
        extras[name] |= set(req.extras)
        if name in picked and picked[name][0] in specs[name] and not new_extras:
            continue
        found = pick_wheel(name, specs[name], tags, python, cache)
        picked[name] = found if found else (None, {"size": 0}, None)
        if found:
            for dep in requirements(found[2], found[1]["size"]):
                if dep.marker is None or any(dep.marker.evaluate({**env, "extra": e})
                                             for e in extras[name] | {""}):
                    wanted.append(dep)
    rows = [{"package": name, "version": None if v is None else str(v), "bytes": f["size"]}
            for name, (v, f, _) in picked.items()]
    return {"platform": platform, "python": python, "packages": rows,
            "total_bytes": sum(r["bytes"] for r in rows)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", default="2.13.0", help="torch release (default: 2.13.0)")
    parser.add_argument("--python", default="cp311", help="wheel tag of the Python (default: cp311)")
    parser.add_argument("--json", help="also write the sizes to this file")
    args = parser.parse_args()
    cache, results = {}, []
    for platform in PLATFORMS:
        result = download(args.version, platform, args.python, cache)
        results.append(result)
        torch_row = result["packages"][0]
        big = [r for r in result["packages"][1:] if r["bytes"] >= 20 * 2**20]
        print(f"{platform}: torch {torch_row['version']} wheel {torch_row['bytes'] / 2**20:,.0f} MiB; "
              f"with its {len(result['packages']) - 1} dependencies {result['total_bytes'] / 2**30:.2f} GiB "
              f"to download ({len(big)} of them 20 MiB or more)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
