#!/usr/bin/env bash
# What a GPU call needs beside the package, in .gpu/ (ignored by git): the Multi30k files and the BPE-8000 encoded
# cache (no spaCy there), and the sacremoses wheel (the literature's tokenised BLEU). The trained models in
# pretrained/ are left out of the working tree until `git checkout -- pretrained` (the call carries 64 MiB).
# On the GPU machine:
#   pip install --no-index --no-deps --target /tmp/site .gpu/whl/*.whl; export PYTHONPATH=/tmp/site
#   export AIAYN_DATA=$PWD/.gpu/data AIAYN_GIT_COMMIT=<the commit>; python3 -m aiayn.plan run STAGE --out DIR
set -euo pipefail
cd "$(dirname "$0")/.."
cache="${AIAYN_DATA:-$HOME/.cache/aiayn/multi30k}"
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
rm -rf .gpu && mkdir -p .gpu/data/encoded .gpu/whl
cp "$cache"/*.gz .gpu/data/
cp "$cache"/encoded/bpe8000-*.pt .gpu/data/encoded/
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 -d .gpu/whl sacremoses==0.1.1
rm -f pretrained/*.pt
du -sh .gpu
echo "tracked files there: $(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 || true)"
