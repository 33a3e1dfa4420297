"""The ``kitae`` command line.

    kitae train [ALGO] [ENV] [--steps N] [--seed S] [--seeds K] [--n-envs E]
                [--config FILE.yaml] [--set KEY=VALUE ...] [--run-dir DIR] [--quiet]

A mistake in the input prints one line (``kitae: error: ...``) that says what is wrong and what
is accepted, and exits with status 2, without a Python traceback.
"""

from __future__ import annotations

import argparse
import json
import sys

EXAMPLES_TRAIN = """examples:
  kitae train                                   # PPO on gymnax:CartPole-v1, compiled, well under a minute
  kitae train dqn CartPole-v1 --steps 50000     # DQN on Gymnasium's CartPole in the host loop
  kitae train ppo gymnax:CartPole-v1 --seeds 8  # 8 seeds in one compiled program
  kitae train sac Pendulum-v1 --set update_cfg.learning_rate=1e-3 --set algo_params.gamma=0.98
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, status 2
        self.exit(2, f"kitae: error: {message}\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an int") from None
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kitae", description="Train, resume, evaluate and plot kitae agents.")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)

    train = sub.add_parser(
        "train",
        help="train an agent",
        description="Train an agent; writes runs/<run_name>/ (config.yaml, logs/, metrics.jsonl, summary.json, "
        "curve.png). JAX environments (gymnax:...) train as one compiled program, Gymnasium ones in a Python loop.",
        epilog=EXAMPLES_TRAIN,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    train.add_argument("algo", nargs="?", default="ppo", help="dqn, ppo, sac or td3 (default: ppo)")
    train.add_argument("env", nargs="?", default="gymnax:CartPole-v1",
                       help="SOURCE:ID, e.g. gymnax:CartPole-v1 or CartPole-v1 (default: gymnax:CartPole-v1)")
    train.add_argument("--steps", type=_positive_int, help="environment steps, summed over environments")
    train.add_argument("--seed", type=_positive_int, help="the seed (default from the preset: 0)")
    train.add_argument("--seeds", type=_positive_int, help="train K seeds (seed, seed+1, ...): vmapped in one program for JAX environments")
    train.add_argument("--n-envs", type=_positive_int, help="number of environments")
    train.add_argument("--config", help="a YAML file with n_envs, n_env_steps, algo_params, update_cfg")
    train.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override a config value, e.g. update_cfg.learning_rate=1e-3 (repeatable)")
    train.add_argument("--run-dir", help="where to write the run (default runs/<algo>-<env>-s<seed>-<time>)")
    train.add_argument("--quiet", action="store_true", help="no progress bar (for scripts and CI)")
    return parser


def _train(args: argparse.Namespace) -> int:
    from kitae.runner import RunSpec, train_run

    spec = RunSpec(
        algo=args.algo, env_id=args.env, steps=args.steps, seed=args.seed, seeds=args.seeds,
        n_envs=args.n_envs, config_file=args.config, sets=args.set, run_dir=args.run_dir, quiet=args.quiet,
    )
    summary = train_run(spec)
    final = summary["final_return"]
    final_text = ", ".join(f"{v:.1f}" for v in final) if isinstance(final, list) else f"{final:.1f}"
    print(
        f"{summary['algo']} on {summary['env']}: {summary['steps']:,} steps, final return {final_text}, "
        f"{summary['sps']:,.0f} steps/s, compile {summary['compile_seconds']:.1f} s, "
        f"wall {summary['wall_seconds']:.1f} s -> {summary['run_dir']}"
    )
    if args.quiet:
        print(json.dumps({k: summary[k] for k in ("run_dir", "final_return", "sps")}))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # --help (0) or a usage error (2, already printed in one line)
        return int(exit_.code or 0)
    if args.command is None:
        parser.print_help()
        return 2
    from kitae.runner import RunError

    try:
        if args.command == "train":
            return _train(args)
    except (RunError, ValueError, TypeError, FileNotFoundError) as error:
        print(f"kitae: error: {error}".replace("\n", " "), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("kitae: interrupted", file=sys.stderr)
        return 130
    return 2


if __name__ == "__main__":
    sys.exit(main())
