#!/usr/bin/env bash
# Build and push the trainer image once per commit: <registry>/alpha-rl-trainer:<git-sha>.
# If that tag already exists in the registry the build is skipped, so every workflow of a commit
# (and every retry) runs the same image.
#
#   REGISTRY=ghcr.io/my-org docker/build.sh          # prints the image reference on its last line
#   PUSH=0 docker/build.sh                            # build locally only
set -euo pipefail
cd "$(dirname "$0")/.."

REGISTRY=${REGISTRY:-ghcr.io/alpha-rl}
PUSH=${PUSH:-1}
SHA=$(git rev-parse HEAD)
# A tag names a commit; an image built from uncommitted changes under that tag would be reused forever.
if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
  echo "error: working tree has uncommitted changes; commit before building $REGISTRY/alpha-rl-trainer:$SHA" >&2
  exit 2
fi
IMAGE="$REGISTRY/alpha-rl-trainer:$SHA"

if [ "$PUSH" = 1 ] && docker manifest inspect "$IMAGE" >/dev/null 2>&1; then
  echo "$IMAGE already in the registry; not rebuilding" >&2
  echo "$IMAGE"
  exit 0
fi

docker build \
  --file docker/Dockerfile \
  --tag "$IMAGE" \
  --label "org.opencontainers.image.revision=$SHA" \
  --label "org.opencontainers.image.source=alpha-rl" \
  .
if [ "$PUSH" = 1 ]; then
  docker push "$IMAGE"
fi
echo "$IMAGE"
