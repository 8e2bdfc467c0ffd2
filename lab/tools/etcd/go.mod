// Pins the etcd server the lab runs. Its own module because k8s.io/kubernetes
// would raise etcd to the version it requires.
module github.com/homelab/bootstrap/lab/tools/etcd

go 1.26.1

require go.etcd.io/etcd/server/v3 v3.6.5
