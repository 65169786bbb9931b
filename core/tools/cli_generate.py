"""``onnxep generate MODEL_DIR --prompt TEXT``: text streamed to stdout as it is made.

stdout holds only the new text; what it cost (the prompt's length, the time
to the first token, tokens per second) goes to stderr at the end, so
``onnxep generate ... > out.txt`` keeps the text alone.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from . import cli_args


def penalty(text: str) -> float:
    """``--repetition-penalty``: a finite number above 0 (1 is none)."""
    try:
        x = float(text)
    except ValueError:
        x = math.nan
    if not (math.isfinite(x) and x > 0):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number above 0; give e.g. 1.1 (1 is no penalty)"
        )
    return x


def stop(text: str) -> str:
    """``--stop``: a non-empty string."""
    if not text:
        raise argparse.ArgumentTypeError("an empty stop string would stop at once; give text")
    return text


def model_dir(text: str) -> str:
    """A model folder (or the .onnx file in one) that exists."""
    path = Path(text)
    if not path.exists():
        raise argparse.ArgumentTypeError(f"model folder {text!r} does not exist")
    if not path.is_dir() and not path.is_file():
        raise argparse.ArgumentTypeError(f"{text!r} is neither a folder nor a file")
    return text


def add_parser(sub: argparse._SubParsersAction, providers_help: str) -> None:
    p = sub.add_parser(
        "generate",
        help="text from a prompt with a model folder, streamed as it comes",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", type=model_dir, metavar="MODEL_DIR")
    p.add_argument("--prompt", required=True, help="the prompt text")
    p.add_argument(
        "--max-new-tokens",
        type=cli_args.positive_int,
        default=None,
        metavar="N",
        help="(default: genai_config.json's max_length less the prompt)",
    )
    p.add_argument(
        "--temperature",
        type=cli_args.tolerance,
        default=None,
        metavar="T",
        help="above 0 samples (0: greedy; default: genai_config.json's search section)",
    )
    p.add_argument("--top-k", type=cli_args.non_negative_int, default=None, metavar="K")
    p.add_argument("--top-p", type=cli_args.fraction, default=None, metavar="P")
    p.add_argument("--repetition-penalty", type=penalty, default=None, metavar="R")
    p.add_argument("--seed", type=cli_args.non_negative_int, default=None, metavar="S")
    p.add_argument("--do-sample", action="store_true", help="sample with the folder's settings")
    p.add_argument("--greedy", action="store_true", help="the most likely token every step")
    p.add_argument("--stop", type=stop, action="append", help="end before this text (repeatable)")
    p.add_argument("--chat", action="store_true", help="the prompt as a user message, templated")
    p.add_argument("--system", default=None, help="with --chat: a system message before it")
    p.add_argument("--providers", type=cli_args.names, default=None, help=providers_help)
    p.set_defaults(fn=cmd_generate)


def _do_sample(args: argparse.Namespace) -> bool | None:
    """The command line samples when asked to by any sampling option; --greedy wins."""
    if args.greedy:
        return False
    if args.do_sample or (args.temperature or 0) > 0 or args.top_k or args.top_p is not None:
        return True
    return None


def cmd_generate(args: argparse.Namespace) -> int:
    from ..errors import InvalidArgument
    from ..generation.generator import Generator

    if args.system is not None and not args.chat:
        raise InvalidArgument("--system is the chat's first message; give --chat too")
    if args.greedy and args.do_sample:
        raise InvalidArgument("--greedy and --do-sample contradict each other; give one")
    gen = Generator(args.model, providers=args.providers)
    pieces = gen.stream(
        args.prompt,
        max_new_tokens=args.max_new_tokens,
        do_sample=_do_sample(args),
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        repetition_penalty=args.repetition_penalty,
        seed=args.seed,
        stop=args.stop,
        chat=args.chat or None,
        system=args.system,
    )
    out = sys.stdout
    try:
        for piece in pieces:
            out.write(piece)
            out.flush()
    except KeyboardInterrupt:
        out.write("\n")
        print("onnxep: interrupted", file=sys.stderr)
        return 130
    out.write("\n")
    out.flush()
    r = pieces.result
    assert r is not None
    ended = {"eos": "an end-of-sequence token", "stop": f"stop string {r.stop_string!r}"}
    why = ended.get(r.finish_reason, "max_new_tokens")
    print(f"onnxep: {r.stats.summary()}; ended at {why}", file=sys.stderr)
    return 0
