"""Shared by several test modules; moved from tests/test_cli_evaluate.py."""
import numpy as np


def _hand_folder(folder):
    """Two models on 2-D features where every number can be checked on paper."""
    folder.mkdir()
    g1 = np.array([[1, 0], [0, 1]], np.float32)  # model 1 gallery: class 0 on x, class 1 on y
    q1 = np.array([[1, 0.2], [0.3, 1], [1, 0.9]], np.float32)  # self-test: hit, hit, hit (0.9 < 1) -> 1.0
    q2 = np.array([[1, 0.1], [1, 1.1], [0.2, 1]], np.float32)  # cross vs g1: hit, hit (1.1 > 1), miss -> 2/3
    ql = np.array([0, 1, 0])
    g2 = np.array([[1, 0.05], [0.05, 1]], np.float32)
    np.savez(folder / "step_1.npz", query_features=q1, query_labels=ql, gallery_features=g1, gallery_labels=np.array([0, 1]))
    np.savez(folder / "step_2.npz", query_features=q2, query_labels=ql, gallery_features=g2, gallery_labels=np.array([0, 1]))
    return folder

