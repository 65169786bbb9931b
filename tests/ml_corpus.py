"""Models converted from fitted estimators (scikit-learn, LightGBM, XGBoost) on synthetic data.

Each factory fits a small estimator with a fixed seed and converts it with the converter a
user would use (skl2onnx, onnxmltools), returning ``(model, feeds)``. The corpus test runs
each on onnxep and onnxruntime; the benchmark uses the larger ``bench_*`` ensembles.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

ROWS = 64  # rows fed to each model


def _data(kind: str, n_classes: int = 2, features: int = 6, rows: int = 160, seed: int = 0):
    from sklearn.datasets import make_classification, make_regression

    if kind == "reg":
        x, y = make_regression(rows, features, n_informative=4, noise=0.5, random_state=seed)
    else:
        x, y = make_classification(
            rows,
            features,
            n_informative=4,
            n_redundant=0,
            n_classes=n_classes,
            n_clusters_per_class=1,
            random_state=seed,
        )
    return x.astype(np.float32), y


def _skl(est: Any, x: np.ndarray, zipmap: bool = True, **options: Any) -> Any:
    from skl2onnx import to_onnx

    opts = {} if zipmap else {id(est): {"zipmap": False}}
    for k, v in options.items():
        opts.setdefault(id(est), {})[k] = v
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return to_onnx(est, x[:1], options=opts or None, target_opset={"": 17, "ai.onnx.ml": 3})


def _feeds(x: np.ndarray) -> dict[str, np.ndarray]:
    return {"X": x[:ROWS]}


def _sk_classifier(make: Callable[[], Any], n_classes: int, zipmap: bool = True, labels=None):
    def build():
        x, y = _data("clf", n_classes)
        if labels is not None:
            y = np.asarray(labels)[y]
        return _skl(make().fit(x, y), x, zipmap), _feeds(x)

    return build


def _sk_regressor(make: Callable[[], Any]):
    def build():
        x, y = _data("reg")
        return _skl(make().fit(x, y), x), _feeds(x)

    return build


def _sk_transform(make: Callable[[], Any], prepare: Callable[[np.ndarray], np.ndarray]):
    def build():
        x, _ = _data("reg")
        x = prepare(x)
        return _skl(make().fit(x), x), {"X": x[:ROWS]}

    return build


def _with_nan(x: np.ndarray) -> np.ndarray:
    x = x.copy()
    x[::7, 1] = np.nan
    x[3::11, 4] = np.nan
    return x


def _lgbm(kind: str, n_classes: int = 2, nan: bool = False, zipmap: bool = True, trees: int = 12):
    def build():
        import lightgbm as lgb
        from onnxmltools import convert_lightgbm
        from onnxmltools.convert.common.data_types import FloatTensorType

        x, y = _data(kind, n_classes)
        if nan:
            x = _with_nan(x)
        params = dict(n_estimators=trees, num_leaves=15, random_state=0, verbose=-1)
        est = (lgb.LGBMRegressor if kind == "reg" else lgb.LGBMClassifier)(**params).fit(x, y)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = convert_lightgbm(
                est,
                initial_types=[("X", FloatTensorType([None, x.shape[1]]))],
                zipmap=zipmap,
                target_opset=15,
            )
        return model, _feeds(x)

    return build


def _xgb(kind: str, n_classes: int = 2, nan: bool = False, trees: int = 12):
    def build():
        import xgboost as xgb
        from onnxmltools import convert_xgboost
        from onnxmltools.convert.common.data_types import FloatTensorType

        x, y = _data(kind, n_classes)
        if nan:
            x = _with_nan(x)
        params = dict(n_estimators=trees, max_depth=4, random_state=0, n_jobs=1)
        est = (xgb.XGBRegressor if kind == "reg" else xgb.XGBClassifier)(**params).fit(x, y)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = convert_xgboost(
                est, initial_types=[("X", FloatTensorType([None, x.shape[1]]))], target_opset=15
            )
        return model, _feeds(x)

    return build


def _dict_vectorizer():
    from sklearn.feature_extraction import DictVectorizer

    rng = np.random.default_rng(0)
    rows = [
        {f"f{j}": float(rng.random()) for j in rng.choice(6, 3, replace=False)} for _ in range(8)
    ]
    from skl2onnx import to_onnx
    from skl2onnx.common.data_types import DictionaryType, FloatTensorType, StringTensorType

    est = DictVectorizer(sparse=False).fit(rows)
    model = to_onnx(
        est,
        initial_types=[("X", DictionaryType(StringTensorType([]), FloatTensorType([])))],
        target_opset={"": 17, "ai.onnx.ml": 3},
    )
    return model, {"X": rows[0]}


def _one_hot(strings: bool):
    def build():
        from sklearn.preprocessing import OneHotEncoder

        rng = np.random.default_rng(0)
        if strings:
            x = np.array([["a", "b", "c"][i] for i in rng.integers(0, 3, 40)], dtype=object)
            x = np.stack([x, x[::-1]], axis=1)
        else:
            x = rng.integers(0, 4, (40, 2)).astype(np.int64)
        est = OneHotEncoder(sparse_output=False, handle_unknown="ignore").fit(x)
        return _skl(est, x), {"X": x[:16]}

    return build


def _label_encoded_tree():
    from sklearn.ensemble import RandomForestClassifier

    return _sk_classifier(
        lambda: RandomForestClassifier(6, max_depth=4, random_state=0),
        3,
        labels=np.array(["cat", "dog", "eel"], dtype=object),
    )


def corpus() -> dict[str, Callable[[], tuple[Any, dict[str, Any]]]]:
    """name -> factory; every model a converter makes from a fitted estimator."""
    from sklearn import ensemble, linear_model, neural_network, preprocessing, svm, tree
    from sklearn.impute import SimpleImputer
    from sklearn.pipeline import make_pipeline

    rf, et, gb = ensemble.RandomForestClassifier, ensemble.ExtraTreesRegressor, ensemble
    return {
        "skl_logistic_binary": _sk_classifier(linear_model.LogisticRegression, 2),
        "skl_logistic_multiclass": _sk_classifier(linear_model.LogisticRegression, 3),
        "skl_logistic_multiclass_nozipmap": _sk_classifier(
            linear_model.LogisticRegression, 3, zipmap=False
        ),
        "skl_logistic_string_labels": _sk_classifier(
            linear_model.LogisticRegression, 3, labels=np.array(["a", "b", "c"], dtype=object)
        ),
        "skl_linear_regression": _sk_regressor(linear_model.LinearRegression),
        "skl_ridge": _sk_regressor(linear_model.Ridge),
        "skl_linear_svc_binary": _sk_classifier(lambda: svm.LinearSVC(random_state=0), 2),
        "skl_linear_svc_multiclass": _sk_classifier(lambda: svm.LinearSVC(random_state=0), 3),
        "skl_svc_rbf_proba": _sk_classifier(lambda: svm.SVC(probability=True, random_state=0), 3),
        "skl_svc_poly_binary": _sk_classifier(lambda: svm.SVC(kernel="poly", degree=2), 2),
        "skl_svc_linear_multiclass": _sk_classifier(lambda: svm.SVC(kernel="linear"), 4),
        "skl_svc_sigmoid_binary_proba": _sk_classifier(
            lambda: svm.SVC(kernel="sigmoid", probability=True, random_state=0), 2
        ),
        "skl_svr": _sk_regressor(svm.SVR),
        "skl_nusvr_linear": _sk_regressor(lambda: svm.NuSVR(kernel="linear")),
        "skl_linear_svr": _sk_regressor(lambda: svm.LinearSVR(random_state=0)),
        "skl_one_class_svm": _sk_transform(lambda: svm.OneClassSVM(gamma=0.1), lambda x: x),
        "skl_decision_tree_classifier": _sk_classifier(
            lambda: tree.DecisionTreeClassifier(max_depth=5, random_state=0), 3
        ),
        "skl_decision_tree_regressor": _sk_regressor(
            lambda: tree.DecisionTreeRegressor(max_depth=6, random_state=0)
        ),
        "skl_random_forest_binary": _sk_classifier(lambda: rf(10, max_depth=5, random_state=0), 2),
        "skl_random_forest_multiclass": _sk_classifier(
            lambda: rf(10, max_depth=5, random_state=0), 4, zipmap=False
        ),
        "skl_random_forest_string_labels": _label_encoded_tree(),
        "skl_random_forest_regressor": _sk_regressor(
            lambda: ensemble.RandomForestRegressor(8, max_depth=5, random_state=0)
        ),
        "skl_extra_trees_regressor": _sk_regressor(lambda: et(8, max_depth=5, random_state=0)),
        "skl_gradient_boosting_binary": _sk_classifier(
            lambda: gb.GradientBoostingClassifier(n_estimators=10, random_state=0), 2
        ),
        "skl_gradient_boosting_multiclass": _sk_classifier(
            lambda: gb.GradientBoostingClassifier(n_estimators=10, random_state=0), 3
        ),
        "skl_gradient_boosting_regressor": _sk_regressor(
            lambda: gb.GradientBoostingRegressor(n_estimators=10, random_state=0)
        ),
        "skl_mlp_classifier": _sk_classifier(
            lambda: neural_network.MLPClassifier((8,), max_iter=300, random_state=0), 3
        ),
        "skl_scaler_logistic_pipeline": _sk_classifier(
            lambda: make_pipeline(
                preprocessing.StandardScaler(), linear_model.LogisticRegression()
            ),
            3,
        ),
        "skl_standard_scaler": _sk_transform(preprocessing.StandardScaler, lambda x: x),
        "skl_normalizer_l1": _sk_transform(lambda: preprocessing.Normalizer("l1"), lambda x: x),
        "skl_normalizer_l2": _sk_transform(lambda: preprocessing.Normalizer("l2"), lambda x: x),
        "skl_normalizer_max": _sk_transform(lambda: preprocessing.Normalizer("max"), lambda x: x),
        "skl_binarizer": _sk_transform(lambda: preprocessing.Binarizer(threshold=0.2), lambda x: x),
        "skl_simple_imputer": _sk_transform(SimpleImputer, _with_nan),
        "skl_one_hot_int": _one_hot(strings=False),
        "skl_one_hot_string": _one_hot(strings=True),
        "skl_dict_vectorizer": _dict_vectorizer,
        "lgbm_binary": _lgbm("clf", 2),
        "lgbm_multiclass": _lgbm("clf", 3),
        "lgbm_multiclass_nozipmap": _lgbm("clf", 3, zipmap=False),
        "lgbm_regressor": _lgbm("reg"),
        "lgbm_regressor_missing": _lgbm("reg", nan=True),
        "lgbm_binary_missing": _lgbm("clf", 2, nan=True),
        "xgb_binary": _xgb("clf", 2),
        "xgb_multiclass": _xgb("clf", 3),
        "xgb_regressor": _xgb("reg"),
        "xgb_regressor_missing": _xgb("reg", nan=True),
        "xgb_multiclass_missing": _xgb("clf", 3, nan=True),
    }
