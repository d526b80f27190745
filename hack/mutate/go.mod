// The mutation check (make mutate): applies each breakage of mutations.tsv
// to a scratch copy of the repository and runs the tests that must catch
// it. A module of its own, standard library only, outside the product.
module uuid-controller/hack/mutate

go 1.26.8
