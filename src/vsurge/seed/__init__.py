"""The seed API's compatibility surface: methods EasyDeL users call that vsurge's own
code paths do not need. One module per class; each module says what calls it."""
