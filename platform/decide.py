"""Answer replenishment decisions for one state or a batch from a trained checkpoint, with latency.

  python platform/decide.py --checkpoint runs/ot16/checkpoint.pt --state state.json [--mode sampled]
  python platform/decide.py --policy decomposition-lookahead:runs/dec16 --instance inst16.json --state state.json

state.json: {"inventory": [I_1..I_n], "in_transit": [[P_11, P_12, P_13], ...], "factor": F} (F a number, or a list
of k numbers for an instance of k >= 2 factors), or a list of such objects for a batch (JSON, or YAML for other
suffixes). The instance is the one stored in the
checkpoint, or --instance. Works with checkpoints of every method (or-transformer, hpo, ppo,
transformer-ppo), or a named policy (--policy: a classical family, classical-best, dp-optimal,
decomposition-lookahead[:DIR], tuned or solved for --instance first). Prints on stdout the JSON that
POST /decide of platform/serve.py answers: for one state object one answer object {"open": Y,
"open_probability": p, "quantity": [Q_1..Q_n] (proposed; executed only if Y = 1), "order": [O_1..O_n]
(O = Y Q, what is placed)}, for a list a list of them in the same order (docs/formats.md); on stderr
one line with the latency. In sampled mode the answer is the first draw of the checkpoint's seeded
stream. For many decisions, serve the policy instead (platform/serve.py).

A state must be one the instance can produce; anything else is refused, naming the state and field:
* in_transit[i][l] (P_{i,l+1}, arriving in l + 1 periods) is in [0, qbar_i], and 0 in slots l >= L_i - 1;
* |inventory[i]| <= 10^4 (qbar_i + lam_i); |factor| <= 10 (each coordinate);
* every value is a finite number (not a string, boolean or NaN).
Why these bounds: serving/decisions.py. A decision that is still not finite (for example from a checkpoint
with NaN weights) is an error too, never an answer.
"""

import json
import sys
import time

from cli.scripts import device, learned_policy_flags, run_cli, script_parser
from envs.instance import Instance
from plumbing.errors import InputError
from plumbing.files import input_file, read_file
from policies.names import checkpoint_spec, policy_spec
from serving.decisions import load_decider, read_states
from trainers.checkpoint import checkpoint_file


def main() -> None:
    parser = script_parser(__doc__)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint", help="a checkpoint of any learned method, or a run folder (its best.pt, else checkpoint.pt)")
    source.add_argument(
        "--policy",
        type=policy_spec,
        metavar="POLICY",
        help="a named policy (as evaluate.py's; decomposition-lookahead answers with its stationary tables), on --instance",
    )
    parser.add_argument("--state", required=True, help="state JSON (one object or a list)")
    parser.add_argument("--instance", help="instance JSON (default: the checkpoint's)")
    learned_policy_flags(parser, "--checkpoint")
    parser.add_argument("--device", default="cpu", type=device, help="torch device: cpu, cuda or cuda:K (default cpu)")
    args = parser.parse_args()
    if args.checkpoint is not None:
        input_file(checkpoint_file(args.checkpoint), "checkpoint")
    elif args.instance is None:
        raise InputError(f"--policy {args.policy}: needs --instance (a named policy is tuned or solved for an instance)")
    input_file(args.state, "state file")
    instance = Instance.load(args.instance) if args.instance else None
    policy = checkpoint_spec(args.checkpoint) if args.checkpoint is not None else args.policy
    data = read_file(args.state, "state file")
    where = f"state file '{args.state}'"
    if args.policy is not None:  # checked before the policy is tuned or solved
        read_states(data, instance, where)
    decider = load_decider(policy, instance, args.mode, args.device, progress=args.policy is not None, precision=args.precision)
    state = read_states(data, decider.instance, where)
    decider.decide(state)  # warm-up
    start = time.perf_counter()
    answer = decider.decide(state)  # the sampled answer is the stream's first draw: the decider restarts it
    latency = time.perf_counter() - start
    print(json.dumps(answer.to_json(isinstance(data, dict))))
    print(f"{state.batch} states decided in {latency * 1e3:.2f} ms ({decider.mode}, after one warm-up call)", file=sys.stderr)


if __name__ == "__main__":
    run_cli(main)
