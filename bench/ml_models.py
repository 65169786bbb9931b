"""Classic machine-learning models of realistic size for the benchmark, from fitted estimators.

    python bench/ml_models.py OUT_DIR     # writes <name>.onnx and <name>.npz (the feeds)

Tree ensembles of the sizes people deploy (100-300 trees, depth 6-8, 32 features) and a
linear and an SVM classifier, fitted on synthetic data with fixed seeds and converted with
skl2onnx / onnxmltools (the test extra), fed ``ROWS`` rows. ``bench/run_all.py`` builds
them into its scratch folder; they need scikit-learn, LightGBM and XGBoost.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROWS = 1000
FEATURES = 32


def _data(kind: str):
    from sklearn.datasets import make_classification, make_regression

    if kind == "reg":
        x, y = make_regression(3000, FEATURES, n_informative=16, noise=1.0, random_state=0)
    else:
        x, y = make_classification(
            3000, FEATURES, n_informative=16, n_classes=3, n_clusters_per_class=2, random_state=0
        )
    return x.astype(np.float32), y


def _skl(est: Any, x: np.ndarray) -> Any:
    from skl2onnx import to_onnx

    return to_onnx(
        est,
        x[:1],
        options={id(est): {"zipmap": False}} if hasattr(est, "classes_") else None,
        target_opset={"": 17, "ai.onnx.ml": 3},
    )


def _mltools(convert: Callable, est: Any) -> Any:
    from onnxmltools.convert.common.data_types import FloatTensorType

    kw = {"zipmap": False} if convert.__name__ == "convert_lightgbm" else {}
    return convert(
        est, initial_types=[("X", FloatTensorType([None, FEATURES]))], target_opset=15, **kw
    )


def models() -> dict[str, Callable[[], tuple[Any, np.ndarray]]]:
    """name -> factory returning (model, X)."""

    def random_forest():
        from sklearn.ensemble import RandomForestClassifier

        x, y = _data("clf")
        est = RandomForestClassifier(200, max_depth=8, random_state=0, n_jobs=2).fit(x, y)
        return _skl(est, x), x

    def gradient_boosting():
        from sklearn.ensemble import GradientBoostingRegressor

        x, y = _data("reg")
        est = GradientBoostingRegressor(n_estimators=200, max_depth=6, random_state=0).fit(x, y)
        return _skl(est, x), x

    def lightgbm():
        import lightgbm as lgb
        from onnxmltools import convert_lightgbm

        x, y = _data("clf")
        est = lgb.LGBMClassifier(n_estimators=100, num_leaves=63, max_depth=8, verbose=-1)
        return _mltools(convert_lightgbm, est.fit(x, y)), x

    def xgboost():
        import xgboost as xgb
        from onnxmltools import convert_xgboost

        x, y = _data("reg")
        est = xgb.XGBRegressor(n_estimators=200, max_depth=6, random_state=0, n_jobs=2)
        return _mltools(convert_xgboost, est.fit(x, y)), x

    def logistic():
        from sklearn.linear_model import LogisticRegression

        x, y = _data("clf")
        return _skl(LogisticRegression(max_iter=500).fit(x, y), x), x

    def svc():
        from sklearn.svm import SVC

        x, y = _data("clf")
        return _skl(SVC(kernel="rbf").fit(x[:600], y[:600]), x), x

    return {
        f"random forest classifier 200 trees depth 8, {ROWS} rows": random_forest,
        f"gradient boosting regressor 200 trees depth 6, {ROWS} rows": gradient_boosting,
        f"lightgbm classifier 3 classes x 100 trees 63 leaves, {ROWS} rows": lightgbm,
        f"xgboost regressor 200 trees depth 6, {ROWS} rows": xgboost,
        f"logistic regression 3 classes, {ROWS} rows": logistic,
        f"svc rbf 3 classes, {ROWS} rows": svc,
    }


def slug(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name.split(",")[0]).strip("_")


def build(out: Path, only: Callable[[str], bool] = lambda _: True) -> dict[str, tuple[Path, dict]]:
    """Fit, convert and save every model; name -> (model path, feeds)."""
    import onnx

    out.mkdir(parents=True, exist_ok=True)
    built = {}
    for name, make in models().items():
        if not only(name):
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model, x = make()
        path = out / f"{slug(name)}.onnx"
        onnx.save(model, path)
        feeds = {model.graph.input[0].name: x[:ROWS]}
        np.savez(path.with_suffix(".npz"), **feeds)
        built[name] = (path, feeds)
    return built


if __name__ == "__main__":
    for name, (path, _) in build(Path(sys.argv[1])).items():
        print(f"{name}: {path}")
