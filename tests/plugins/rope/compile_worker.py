"""Compile RoPE kernel variants to PTX in a fresh process (test_aot.py runs it without TRITON_INTERPRET).

Reads ``{"arch": int, "variants": [{"spec": {...}, "qk_dtype": ..., "table_dtype": ..., "block_h": ...,
"num_warps": ..., "assemble": bool}, ...]}`` on stdin, prints one JSON result per variant on stdout.
"""

from __future__ import annotations

import json
import re
import sys


def main() -> None:
    from posenc.plugins.rope.aot import assemble_ptx, compile_rope_ptx, expected_param_count, ptx_entry_params
    from posenc.plugins.rope.spec import RopeKernelSpec

    request = json.loads(sys.stdin.read())
    arch = int(request["arch"])
    results = []
    for item in request["variants"]:
        try:
            spec = RopeKernelSpec(**item["spec"])
            compiled = compile_rope_ptx(
                spec,
                arch=arch,
                qk_dtype=item["qk_dtype"],
                table_dtype=item.get("table_dtype"),
                block_h=item.get("block_h", 8),
                num_warps=item.get("num_warps", 2),
            )
            name, params = ptx_entry_params(compiled.ptx)
            target = re.search(r"\.target\s+(\S+)", compiled.ptx)
            version = re.search(r"\.version\s+(\S+)", compiled.ptx)
            results.append(
                {
                    "name": name,
                    "kernel_name": compiled.name,
                    "params": params,
                    "expected_params": expected_param_count(spec),
                    "removed_scratch_params": compiled.removed_scratch_params,
                    "target": target.group(1) if target else None,
                    "version": version.group(1) if version else None,
                    "vector_loads": sum("ld.global.v4" in line for line in compiled.ptx.splitlines()),
                    "cubin_bytes": len(assemble_ptx(compiled.ptx, arch)) if item.get("assemble") else None,
                }
            )
        except Exception as exc:  # reported to the test, which fails with the message
            results.append({"error": f"{type(exc).__name__}: {exc}"})
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
