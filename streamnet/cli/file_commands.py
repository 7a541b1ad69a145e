"""streamnet-submit's commands on files: export (a checkpoint's weights for PyTorch)
and plot (a --metrics-log as PNG curves)."""
from __future__ import annotations

import sys

from .common import check_writable


def cmd_export(a) -> int:
    from ..training.export import export
    check_writable(a.out, "OUT")
    net = export(a.checkpoint, a.out, a.format, model=a.model, input_size=a.input_size)
    print(f"wrote {net.num_params:,} parameters of {net!r} to {a.out} ({a.format})", file=sys.stderr)
    return 0


def cmd_plot(a) -> int:
    from .metrics_log import plot
    check_writable(a.out, "--out")
    out = plot(a.file, a.out)
    print(f"wrote {out}", file=sys.stderr)
    return 0


def add_commands(sub) -> None:
    from ..training.export import FORMATS
    x = sub.add_parser("export", help="write a checkpoint's weights as safetensors or a PyTorch state_dict")
    x.add_argument("checkpoint", metavar="CHECKPOINT", help="a .ckpt file written with --checkpoint-dir")
    x.add_argument("out", metavar="OUT", help="file to write (e.g. lenet5.safetensors, lenet5.pt)")
    x.add_argument("--format", choices=FORMATS, default="safetensors",
                   help="safetensors (default; needs nothing) or torch (torch.save of a state_dict; needs PyTorch)")
    x.add_argument("--model", choices=("lenet5", "alexnet"),
                   help="the network, for a checkpoint that holds parameters only (others record it, and "
                        "a --model that disagrees is refused)")
    x.add_argument("--input-size", type=int, metavar="N", help="with --model alexnet: 64 or 224")
    x.set_defaults(func=cmd_export)

    p = sub.add_parser("plot", help="draw a --metrics-log file as PNG curves (needs matplotlib)")
    p.add_argument("file", metavar="FILE", help="a file written by train or submit --wait with --metrics-log")
    p.add_argument("--out", metavar="PNG", help="where to write the figure (default: FILE with .png)")
    p.set_defaults(func=cmd_plot)
