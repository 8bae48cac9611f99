"""`omnitrace hooks [--deploy FILE]`: before a load test, which of omnitrace's hooks the
installed vLLM-Omni will see, per hook site: found, missing, or not on the deploy file's
path (V1 chunk adapter, Model Runner V2's native data plane, talker-first audio, the
shared-memory connector). Run it with the Python that serves (it imports the modules the
hooks wrap, as the server will: tens of seconds). The check itself:
``omnitrace.inject.coverage``.

Exit status: 0 every hook on the deploy's paths is found, 1 some are missing (or a path
has none in this release), 2 bad input
(no vLLM-Omni in this Python, a version omnitrace has no hooks for, a deploy file that
cannot be read).
"""
from __future__ import annotations

import argparse
import json

from omnitrace import console
from omnitrace.cli.helpformat import DefaultsFormatter, OneLineParser
from omnitrace.inject import coverage


# vLLM-Omni's platforms (vllm_omni/platforms/) and the CPU one its plugins add: an unknown
# name would match no section of a deploy file and be taken silently
PLATFORMS = ("cuda", "rocm", "npu", "xpu", "musa", "cpu")


def _parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="omnitrace hooks", description=__doc__.split("\n\n")[0].replace("`", ""),
                formatter_class=DefaultsFormatter,
                epilog="examples:\n  omnitrace hooks\n  omnitrace hooks --deploy qwen3_omni_moe_mrv2.yaml\n"
                       "  omnitrace hooks --deploy my-deploy.yaml --platform rocm --json")
    p.add_argument("--deploy", metavar="FILE", default=None,
                   help="a vLLM-Omni deploy file (a path, or the name of one in vLLM-Omni's deploy/): "
                        "check the hooks of the paths it takes")
    p.add_argument("--model", default=None,
                   help="the model the deploy serves (a local path or cached id): its pipeline says "
                        "which v2 stages use the native data plane")
    p.add_argument("--platform", default="cuda", choices=PLATFORMS,
                   help="the platform whose section of the deploy file applies")
    p.add_argument("--patches", action="append", default=[], metavar="DIR",
                   help="your own hook definitions, as `omnitrace run --patches` takes them (repeatable)")
    p.add_argument("--json", action="store_true", help="the result as JSON on stdout")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.model and not args.deploy:
            raise coverage.CoverageError("--model needs --deploy")
        cov = coverage.check(args.deploy, args.platform, args.patches, args.model)
    except coverage.CoverageError as exc:
        console.say("hooks", str(exc))
        return 2
    if args.json:
        print(json.dumps(coverage.as_json(cov), indent=2))
    else:
        print(coverage.render(cov))
    if cov.unhooked:
        console.say("hooks", f"this deploy takes paths {cov.version} has no hooks for: {', '.join(cov.unhooked)}")
    if cov.missing:
        console.say("hooks", f"{len(cov.missing)} hook(s) on this deploy's paths are missing: "
                             + ", ".join(s.name for s in cov.missing))
    return 1 if cov.missing or cov.unhooked else 0
