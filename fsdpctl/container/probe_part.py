"""The probe's container part (appended to the probe's source, like the hardware part): the runtime on
this host and whether it answers, the image here (pulled first as ``pull`` says) and its digest, then
the probe run again inside the image, whose Python, torch, NCCL and packages are the ones the ranks get.

Standard library only, Python 3.8+: it runs with the host's own Python. ``spec`` is
``fsdpctl.container.runtime.probe_spec``'s: runtime, image, pull, python (inside), run (the runtime's
words before the image), gpu_flags and ib_flags (added where the host has the devices), pull_seconds,
start_seconds, source (the probe's own source, zlib-compressed and base64: fed to the image's Python
on stdin).
"""

import hashlib
import json
import os
import shutil
import subprocess

# Facts the image's Python gives (the host's own are kept for the rest: its cards, disks, GPUs).
INSIDE_FACTS = ("python", "torch", "packages", "deep", "stacks", "os", "nccl_conf")
_BOOT = ("import base64,sys,zlib;"
         "exec(compile(zlib.decompress(base64.b64decode(sys.stdin.read())),'fsdpctl-probe','exec'))")
_LIBIBVERBS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/lib64",
               "/lib/x86_64-linux-gnu")


def run_quietly(argv, timeout, stdin=None):
    """(exit status, stdout, stderr's last line); 127 when the program is missing, 124 on timeout."""
    try:
        done = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        return 127, "", "%s: not found" % argv[0]
    except subprocess.TimeoutExpired:
        return 124, "", "%s did not answer within %.0f s" % (" ".join(argv[:3]), timeout)
    lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
    return done.returncode, done.stdout, lines[-1].strip() if lines else ""


def _file_digest(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return "sha256:" + digest.hexdigest()


def _image_id(runtime, image):
    """(id, repo digests, error) of the image in this host's store."""
    inspect = [runtime, "image", "inspect", "--format", "{{.Id}} {{json .RepoDigests}}", image]
    status, out, err = run_quietly(inspect, 60)
    if status != 0:
        return None, [], err or "exit %d" % status
    first, _, rest = out.strip().partition(" ")
    try:
        digests = json.loads(rest) or []
    except ValueError:
        digests = []
    return (first if first.startswith("sha256:") else "sha256:" + first), digests, None


def _image_state(spec, found):
    """The image here: pulled first where ``pull`` says so; its id (the digest compared across hosts)."""
    runtime, image = spec["runtime"], spec["image"]
    if runtime == "apptainer":
        path = os.path.expanduser(image)
        if "://" in image:  # apptainer pulls a URI into its cache as it runs: no file to compare here
            found["image_state"] = "remote"
        elif os.path.isfile(path):
            found["image_state"], found["digest"] = "present", _file_digest(path)
        else:
            found["image_state"] = "missing"
        return
    image_id, digests, error = _image_id(runtime, image)
    if spec.get("pull") == "always" or (image_id is None and spec.get("pull") == "missing"):
        status, _, pull_error = run_quietly([runtime, "pull", "-q", image], spec["pull_seconds"])
        found["pulled"] = status == 0
        if status != 0:
            found["pull_error"] = pull_error or "exit %d" % status
        image_id, digests, error = _image_id(runtime, image)
    if image_id is None:
        found["image_state"], found["image_error"] = "missing", error
    else:
        found["image_state"], found["digest"], found["repo_digests"] = "present", image_id, digests


def _inside_args(args):
    """What the probe inside the image is asked: the Python's part only (the host answers the rest)."""
    keep = ("workdir", "deep", "packages")
    return dict((k, v) for k, v in args.items() if k in keep)


def _inside(spec, args):
    """The probe's answer from inside the image, run with the flags a run gets (its GPUs, IB devices)."""
    argv = list(spec["run"])
    if os.path.exists("/dev/nvidiactl"):
        argv += spec["gpu_flags"]
    if os.path.isdir("/dev/infiniband"):
        argv += spec["ib_flags"]
    check = ("import glob,os,sys;print(int(os.path.isdir('/dev/infiniband')),"
             "int(any(glob.glob(d+'/libibverbs.so*') for d in %r)))" % (_LIBIBVERBS,))
    image = os.path.expanduser(spec["image"]) if spec["runtime"] == "apptainer" else spec["image"]
    inner = argv + [image, "sh", "-c", '"$0" -c "$1" && exec "$0" -c "$2" "$3"', spec["python"], check, _BOOT,
                    json.dumps(_inside_args(args))]
    status, out, err = run_quietly(inner, spec["start_seconds"], stdin=spec["source"])
    begin, end = out.rfind(BEGIN), out.rfind(END)  # noqa: F821 - the probe's sentinels come first in the source
    if status != 0 or begin < 0 or end < begin:
        return {"error": err or "exit %d" % status, "status": status}
    first = out[:begin].strip().splitlines()
    words = first[-1].split() if first else []
    facts = json.loads(out[begin + len(BEGIN):end].strip())
    facts["ib_devices"] = words[:1] == ["1"]
    facts["libibverbs"] = words[1:2] == ["1"]
    return facts


def container_into(facts, args):
    """With ``args["container"]``, the container part into the probe's ``facts``: the ranks get the
    image's Python, not the host's."""
    if not args.get("container"):
        return
    found = facts["container"] = container(args["container"], args)
    if found["runtime"] == "pyxis":
        return  # Slurm starts the image with the step: this host's own facts stand
    inside = found.get("inside") or {}
    for name in INSIDE_FACTS:
        facts[name] = inside.get(name)
    if not inside.get("python"):
        facts["python"] = {"path": args["container"]["python"], "version": None}
        facts["torch"] = {}


def container(spec, args):
    """Everything the container part says of this host; the image's facts under ``inside``."""
    runtime = spec["runtime"]
    binary = {"pyxis": "enroot"}.get(runtime, runtime)  # Pyxis runs enroot on the node
    found = {"runtime": runtime, "image": spec["image"], "path": shutil.which(binary)}
    if found["path"] is None:
        found["error"] = "not-installed"
        return found
    status, out, err = run_quietly([binary, "version" if binary == "enroot" else "--version"], 30)
    found["version"] = out.strip().splitlines()[0] if status == 0 and out.strip() else None
    if runtime == "pyxis":
        found["image_state"] = "remote"
        return found
    if runtime in ("docker", "podman"):
        status, _, err = run_quietly([binary, "info", "--format", "{{json .}}"], 60)
        if status != 0:
            found["error"], found["detail"] = "not-usable", err or "exit %d" % status
            return found
    _image_state(spec, found)
    if found.get("image_state") != "missing":
        found["inside"] = _inside(spec, args)
    return found

