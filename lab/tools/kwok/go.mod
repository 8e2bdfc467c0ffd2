// Pins kwok, which keeps the lab's Node objects Ready and its pods Running.
module github.com/homelab/bootstrap/lab/tools/kwok

go 1.26.1

require sigs.k8s.io/kwok v0.8.0
