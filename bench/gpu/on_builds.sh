#!/usr/bin/env bash
# Put another release's builds into the pack in .gpu/: its kernel package (sgk.tar.xz) and its
# DeepGEMM (deep_gemm in site.tar.xz), the compiled packages a release pins exactly. For a probe
# of whether a release's pin is stricter than its code: 0.5.18 on pins builds that cannot load
# on the GPU image's torch, 0.5.17's load (bench/gpu/abi.py, and `abi.py R --builds-of 0.5.17`
# for what R's code imports from the kernel that 0.5.17's lacks). Run from the project's root:
#   bash ../shared/gpu-sglang/pack.sh 0.5.17 && mv .gpu ../donor
#   bash ../shared/gpu-sglang/pack.sh 0.5.18 && bash bench/gpu/on_builds.sh ../donor
# .gpu/VERSION stays the release's; .gpu/BUILDS_OF names the donor's. The call's rows record the
# builds its servers imported (machine.packages), and a probe's VERSIONS.md cell names them.
set -euo pipefail
DONOR=${1:?usage: on_builds.sh DONOR_PACK_DIR (a .gpu folder of the release whose builds to use)}
G=.gpu
for f in "$G/VERSION" "$G/sgk.tar.xz" "$G/site.tar.xz" "$G/sgl.tar.xz" "$DONOR/VERSION" "$DONOR/sgk.tar.xz" "$DONOR/site.tar.xz"; do
  [ -f "$f" ] || { echo "on_builds.sh: no $f (pack.sh writes it)" >&2; exit 2; }
done
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
mkdir "$W/site" "$W/donor"
xz -dc "$G/site.tar.xz" | tar -xf - -C "$W/site"
xz -dc "$DONOR/site.tar.xz" | tar -xf - -C "$W/donor"
rm -rf "$W"/site/deep_gemm "$W"/site/sgl_deep_gemm-*.dist-info
# The donor's DeepGEMM where it pins one (a release before 0.5.13 pins none: the release's goes too).
if compgen -G "$W/donor/sgl_deep_gemm-*.dist-info" >/dev/null; then
  cp -r "$W"/donor/deep_gemm "$W"/donor/sgl_deep_gemm-*.dist-info "$W/site/"
fi
# The donor's kernel archive is larger than a later release's own (0.5.17's is 15.7 MB): the
# rewritten archives take xz -9e, not pack.sh's -6, so that the pack still travels beside the
# checkout under the 64 MiB carry (0.5.20 on 0.5.17's builds: 63.2 MB at -6, 59.5 MB at -9e).
# Written beside, then renamed: a pack is never left half swapped.
tar -C "$W/site" -cf - . | xz -T0 -9e > "$W/site.tar.xz"
xz -dc "$G/sgl.tar.xz" | xz -T0 -9e > "$W/sgl.tar.xz"
cp "$DONOR/sgk.tar.xz" "$W/sgk.tar.xz"
mv "$W/site.tar.xz" "$G/site.tar.xz"
mv "$W/sgl.tar.xz" "$G/sgl.tar.xz"
mv "$W/sgk.tar.xz" "$G/sgk.tar.xz"
cat "$DONOR/VERSION" > "$G/BUILDS_OF"
echo "on_builds.sh: SGLang $(cat "$G/VERSION") on the builds of $(cat "$G/BUILDS_OF"); $(du -sh "$G" | cut -f1)"
