package config

import (
	"time"

	"github.com/homelab/bootstrap/factory"
)

// Defaults used when a field is not set.
const (
	DefaultTalosVersion      = "v1.13.3"
	DefaultKubernetesVersion = "1.36.1"
	DefaultStorageClass      = "nfs-storage"
	DefaultNFSChartRepo      = "https://kubernetes-sigs.github.io/nfs-subdir-external-provisioner/"
	DefaultNFSChartVersion   = "4.0.18"
	DefaultCiliumChartRepo   = "https://helm.cilium.io/"
	DefaultCiliumVersion     = "1.20.2"
	DefaultFluxVersion       = "v2.9.5"
	DefaultFluxPath          = "./infra"
	DefaultFluxBranch        = "main"
)

// Default returns a configuration holding every default; decoding a file
// overlays it, so an absent key keeps its default and a present one wins.
func Default() *Config {
	return &Config{
		Cluster: Cluster{
			TalosVersion:       DefaultTalosVersion,
			Schematic:          Schematic{Extensions: []string{factory.GuestAgent}},
			Factory:            factory.DefaultURL,
			UpgradeParallelism: 1,
			KubernetesVersion:  DefaultKubernetesVersion,
			Patches:            Patches{Nodes: map[string][]string{}},
			Timeouts: TalosTimeouts{
				Call:      Duration(30 * time.Second),
				Install:   Duration(20 * time.Minute),
				Reboot:    Duration(10 * time.Minute),
				Bootstrap: Duration(10 * time.Minute),
				Health:    Duration(15 * time.Minute),
			},
		},
		Proxmox: Proxmox{
			Node:        "pve",
			DiskStorage: "local-lvm",
			ISOStorage:  "local",
			Boot:        BootAuto,
			Bridge:      "vmbr0",
			CPU:         CPUHost,
			VM:          BaselineVM(),
			Parallelism: 4,
			TaskTimeout: Duration(10 * time.Minute),
			BootTimeout: Duration(10 * time.Minute),
		},
		Storage: Storage{NFS: NFS{
			StorageClass:  DefaultStorageClass,
			ReclaimPolicy: "Delete",
			ChartRepo:     DefaultNFSChartRepo,
			ChartVersion:  DefaultNFSChartVersion,
			Probe: NFSProbe{
				WriteTest:      true,
				PortmapperPort: 111,
				Timeout:        Duration(15 * time.Second),
			},
		}},
		CNI: CNI{
			Name:   "flannel",
			Cilium: Cilium{ChartRepo: DefaultCiliumChartRepo, ChartVersion: DefaultCiliumVersion},
		},
		Flux: Flux{
			Branch:     DefaultFluxBranch,
			Path:       DefaultFluxPath,
			Version:    DefaultFluxVersion,
			Components: []string{"source-controller", "kustomize-controller", "helm-controller", "notification-controller"},
			Interval:   Duration(time.Minute),
			Timeout:    Duration(5 * time.Minute),
			LocalSnapshot: LocalSnapshot{
				Source:  ".",
				Listen:  "0.0.0.0:8418",
				Refresh: Duration(30 * time.Second),
			},
		},
		Backup: Backup{Keep: 7, MaxAge: Duration(26 * time.Hour)},
		Postcheck: Postcheck{
			Timeout:      Duration(5 * time.Minute),
			PVCTimeout:   Duration(2 * time.Minute),
			Keep:         30,
			CertWarnDays: 30,
		},
		State: StateDirs{Dir: "ai/state", TalosDir: ".talos", KeepRuns: 30},
	}
}
