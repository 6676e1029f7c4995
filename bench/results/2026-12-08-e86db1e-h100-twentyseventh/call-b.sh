# Second call on an H200 (issue 12's records with pack n26): the decode table with the decode kernel modes side by
# side, paged and varlen prefill (device-h200-records' ab part). On an H100 it stops (nothing prepared for it).
set -u
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "gpu: $gpu"
[[ "$gpu" == *H200* ]] || { echo "not an H200: nothing to do"; exit 3; }
scripts/packs-xz --unpack >/dev/null || exit 1
OUT=$OUT/r FA4_H200_PARTS="ab:250" scripts/device-h200-records build-prebuilt-n26
echo CALL_DONE
