package pvesim

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"testing"
	"time"

	pxapi "github.com/Telmate/proxmox-api-go/proxmox"
)

// TestTelmateDrivesSimulator checks that the library the product uses gets
// through its own typed create and read paths against the simulator without
// tripping over JSON types (it type-asserts freely and panics otherwise).
func TestTelmateDrivesSimulator(t *testing.T) {
	s := newSim(t, Options{ISOs: []ISOSpec{{Storage: "local", Name: "talos.iso", Size: 100 << 20}}})
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(s.CACertPEM())
	c, err := pxapi.NewClient(s.APIURL(), nil, "", &tls.Config{RootCAs: pool}, "", 30, false)
	if err != nil {
		t.Fatal(err)
	}
	id, secret := s.Token()
	var tok pxapi.ApiTokenID
	if err := tok.Parse(id); err != nil {
		t.Fatal(err)
	}
	c.SetAPIToken(tok, pxapi.ApiTokenSecret(secret))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	v, err := c.GetVersion(ctx)
	if err != nil || v.Major != 8 || v.Minor != 2 {
		t.Fatalf("version %v %v", v, err)
	}
	next, err := c.GetNextID(ctx, nil)
	if err != nil || next != 100 {
		t.Fatalf("nextid %v %v", next, err)
	}

	vmid := pxapi.GuestID(701)
	node := pxapi.NodeName("pve")
	name := pxapi.GuestName("cp-1")
	tags := pxapi.Tags{"talos", "bootstrap-lab"}
	cfg := pxapi.ConfigQemu{
		ID: &vmid, Node: &node, Name: &name, Tags: &tags, QemuOs: "l26", Scsihw: "virtio-scsi-single", Boot: "order=scsi0;ide2",
		CPU:    &pxapi.QemuCPU{Cores: ptr(pxapi.QemuCpuCores(2)), Type: ptr(pxapi.CpuType_Host)},
		Memory: &pxapi.QemuMemory{CapacityMiB: ptr(pxapi.QemuMemoryCapacity(2048))},
		Agent:  &pxapi.QemuGuestAgent{Enable: ptr(true)},
		Disks: &pxapi.QemuStorages{
			Scsi: &pxapi.QemuScsiDisks{Disk_0: &pxapi.QemuScsiStorage{Disk: &pxapi.QemuScsiDisk{Storage: "local-lvm", SizeInKibibytes: 8 << 20, Format: pxapi.QemuDiskFormat_Raw, Backup: true}}},
			Ide:  &pxapi.QemuIdeDisks{Disk_2: &pxapi.QemuIdeStorage{CdRom: &pxapi.QemuCdRom{Iso: &pxapi.IsoFile{Storage: "local", File: "talos.iso"}}}},
		},
		Networks: pxapi.QemuNetworkInterfaces{0: {Model: ptr(pxapi.QemuNetworkModelVirtIO), Bridge: ptr("vmbr0")}},
	}
	if _, err := cfg.Create(ctx, c); err != nil {
		t.Fatalf("Telmate create: %v", err)
	}
	guests, err := pxapi.ListGuests(ctx, c)
	if err != nil || len(guests) != 1 || guests[0].GetName() != "cp-1" || len(guests[0].GetTags()) != 2 {
		t.Fatalf("list guests: %v %v", guests, err)
	}
	vmr := pxapi.NewVmRef(vmid)
	if err := c.CheckVmRef(ctx, vmr); err != nil {
		t.Fatal(err)
	}
	read, err := pxapi.NewConfigQemuFromApi(ctx, vmr, c)
	if err != nil {
		t.Fatalf("Telmate read: %v", err)
	}
	if read.Disks == nil || read.Disks.Scsi == nil || read.Disks.Scsi.Disk_0 == nil || read.Disks.Scsi.Disk_0.Disk == nil ||
		read.Disks.Scsi.Disk_0.Disk.SizeInKibibytes != 8<<20 {
		t.Fatalf("Telmate read disks: %+v", read.Disks)
	}
	if *read.CPU.Cores != 2 || *read.Memory.CapacityMiB != 2048 {
		t.Fatalf("Telmate read cpu/mem: %v %v", *read.CPU.Cores, *read.Memory.CapacityMiB)
	}
}

func ptr[T any](v T) *T { return &v }
