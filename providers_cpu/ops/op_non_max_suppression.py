"""NonMaxSuppression (CPU): greedy selection per (batch, class), onnxruntime's tie and IoU rules."""

from __future__ import annotations

import numpy as np

from onnxep.providers.kernel import kernel


def _corners(boxes, center):
    if center:
        cx, cy, w, h = boxes.T
        return np.stack([cy - h / 2, cx - w / 2, cy + h / 2, cx + w / 2], axis=1)
    y1, x1, y2, x2 = boxes.T
    # Either diagonal may be given: normalize to (min, max).
    return np.stack(
        [np.minimum(y1, y2), np.minimum(x1, x2), np.maximum(y1, y2), np.maximum(x1, x2)], axis=1
    )


@kernel("NonMaxSuppression", since=(10, 11))
def non_max_suppression(node, xp):
    center = int(node.attr("center_point_box", 0)) == 1

    def run(boxes, scores, max_out=None, iou_thr=None, score_thr=None):
        limit = 0 if max_out is None or max_out.size == 0 else int(max_out.reshape(-1)[0])
        iou_t = 0.0 if iou_thr is None or iou_thr.size == 0 else float(iou_thr.reshape(-1)[0])
        has_st = score_thr is not None and score_thr.size > 0
        st = float(score_thr.reshape(-1)[0]) if has_st else 0.0
        picked = []
        if limit > 0:
            for b in range(boxes.shape[0]):
                bx = _corners(boxes[b].astype(np.float64), center)
                area = (bx[:, 2] - bx[:, 0]) * (bx[:, 3] - bx[:, 1])
                for c in range(scores.shape[1]):
                    sc = scores[b, c].astype(np.float64)
                    cand = np.nonzero(sc > st)[0] if has_st else np.arange(sc.shape[0])
                    cand = cand[np.argsort(-sc[cand], kind="stable")]
                    keep: list[int] = []
                    alive = np.ones(cand.shape[0], dtype=bool)
                    for i in range(cand.shape[0]):
                        if not alive[i]:
                            continue
                        k = cand[i]
                        keep.append(int(k))
                        if len(keep) >= limit:
                            break
                        rest = cand[i + 1 :]
                        yy1 = np.maximum(bx[k, 0], bx[rest, 0])
                        xx1 = np.maximum(bx[k, 1], bx[rest, 1])
                        yy2 = np.minimum(bx[k, 2], bx[rest, 2])
                        xx2 = np.minimum(bx[k, 3], bx[rest, 3])
                        inter = np.clip(yy2 - yy1, 0, None) * np.clip(xx2 - xx1, 0, None)
                        union = area[k] + area[rest] - inter
                        ok = (area[k] > 0) & (area[rest] > 0) & (inter > 0)
                        with np.errstate(divide="ignore", invalid="ignore"):
                            iou = np.where(ok, inter / np.where(union > 0, union, 1), 0.0)
                        alive[i + 1 :] &= ~(iou > iou_t)
                    picked.extend((b, c, k) for k in keep)
        out = np.array(picked, dtype=np.int64).reshape(-1, 3)
        return (out,)

    return run
