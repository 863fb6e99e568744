"""Compute behind the dashboard's Learn pages: small, seeded, pure functions that return numbers and DataFrames.

One module per demo, each illustrating a figure or a statement of the papers (``shared/papers``):

* ``definition1``: Definition 1's pair inequalities counted by hand vs the empirical criterion (ECC).
* ``simplex``: PSP's probability simplex, the centring projection and Props. 1-2 of paper 000.
* ``stationarity``: a 2-D feature space trained on digits with a learnable vs a fixed classifier.
* ``caps``: paper 001's Monte-Carlo check of Definition 1 on hyperspherical caps.
* ``alignment``: paper 004's orthogonal, affine and lambda-orthogonal maps on a 2-D pair.

Nothing here imports Streamlit; the pages in ``app/learn`` only draw what these functions return.
"""
