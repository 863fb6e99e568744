"""Mapping adapters between two models' embeddings; the package imports nothing, callers import the module they need.

Paper 004's adapters trained on stored (frozen) features (torch): ``fit.fit_adapters`` trains B_perp, B_lambda, F and the
FCT baseline from old/new feature arrays of the same samples, ``pair.AdapterPair`` applies, saves and describes them,
``modules`` holds the networks, ``losses`` their losses, ``table.combination_table`` evaluates the paper's
query/gallery rows. Post-hoc maps new -> old fitted on paired embeddings from any source (numpy; a check's plan fits
them without loading torch): ``posthoc`` the kinds, ``artifact`` the exported folder, ``onnx_graph`` its ONNX graph,
``recovery`` the curve vs N, ``batch_apply`` a file mapped block by block.
"""
