#!/bin/sh
# Run one push or rollout on the cluster: a Job made from the push-model or rollout CronJob
# template (both suspended: applying the stack runs neither), this run's flags in PUSH_ARGS or
# ROLLOUT_ARGS (split on spaces; the template adds --config, --base-path and --server).
#
#   deploy/k8s/run-job.sh push "--name minilm-intent --promote canary stable"
#   deploy/k8s/run-job.sh rollout "--name minilm-intent --version 7"
#
# NAMESPACE (default bert-gateway) is the stack's namespace; KUBECTL (default kubectl) the client.
# Prints the Job's name; follow it with `kubectl -n NAMESPACE logs -f job/NAME`.
set -eu
usage() {
  echo "usage: $0 push|rollout \"<push_model.py or rollout.py flags>\"" >&2
  exit 2
}
[ $# -eq 2 ] || usage
case "$1" in
  push) template=push-model; variable=PUSH_ARGS ;;
  rollout) template=rollout; variable=ROLLOUT_ARGS ;;
  *) usage ;;
esac
[ -n "$2" ] || usage
kubectl="${KUBECTL:-kubectl}"
namespace="${NAMESPACE:-bert-gateway}"
job="$1-$(date +%s)"
"$kubectl" -n "$namespace" create job "$job" --from="cronjob/$template" --dry-run=client -o yaml \
  | "$kubectl" set env --local -f - -o yaml "$variable=$2" \
  | "$kubectl" -n "$namespace" create -f - >&2
echo "$job"
