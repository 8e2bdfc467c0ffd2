package nfsprovisioner

import (
	"context"
	"errors"
	"fmt"
	"path"
	"regexp"
	"strconv"
	"strings"
	"sync"

	"github.com/go-logr/logr"
	"github.com/rs/zerolog"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v10/controller"

	"github.com/homelab/bootstrap/lab/nfs"
)

// provisioner does what nfs-subdir-external-provisioner's pod does, over the
// NFS protocol instead of a kernel mount, while its Deployment is Available
// (active); otherwise it provisions and deletes nothing.
type provisioner struct {
	name   string
	port   int
	client kubernetes.Interface
	log    zerolog.Logger

	mu     sync.Mutex
	active bool
	target target
}

var (
	_ controller.Provisioner = (*provisioner)(nil)
	_ controller.Qualifier   = (*provisioner)(nil)
)

func (p *provisioner) current() (target, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.target, p.active
}

func (p *provisioner) activate(tg target) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.target, p.active = tg, true
}

func (p *provisioner) deactivate() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.active = false
}

// errNotRunning is what a claim or volume meets while the provisioner's
// Deployment is not Available (the library retries).
func (p *provisioner) errNotRunning() error {
	return fmt.Errorf("provisioner %s is not running", p.name)
}

// ShouldProvision keeps claims waiting, without events, while the
// provisioner is not running, as when its pod is down.
func (p *provisioner) ShouldProvision(context.Context, *corev1.PersistentVolumeClaim) bool {
	_, active := p.current()
	return active
}

// Provision creates the claim's directory in the export and returns an NFS
// PersistentVolume for it.
func (p *provisioner) Provision(ctx context.Context, o controller.ProvisionOptions) (*corev1.PersistentVolume, controller.ProvisioningState, error) {
	if o.PVC.Spec.Selector != nil {
		return nil, controller.ProvisioningFinished, errors.New("claim Selector is not supported")
	}
	dir := o.PVC.Namespace + "-" + o.PVC.Name + "-" + o.PVName
	if pattern := o.StorageClass.Parameters["pathPattern"]; pattern != "" {
		dir = expandPathPattern(pattern, o.PVC)
		if dir == "" {
			return nil, controller.ProvisioningFinished, fmt.Errorf("pathPattern %q expands to nothing", pattern)
		}
	}
	tg, active := p.current()
	if !active {
		return nil, controller.ProvisioningNoChange, p.errNotRunning()
	}
	m, err := nfs.Dial(ctx, tg.server, p.port, tg.path)
	if err != nil {
		return nil, controller.ProvisioningFinished, fmt.Errorf("mounting the NFS export: %w", err)
	}
	defer m.Close()
	if err := m.MkdirAll(ctx, dir, 0o777); err != nil {
		return nil, controller.ProvisioningFinished, fmt.Errorf("creating %s over NFS: %w", dir, err)
	}
	reclaim := corev1.PersistentVolumeReclaimDelete
	if o.StorageClass.ReclaimPolicy != nil {
		reclaim = *o.StorageClass.ReclaimPolicy
	}
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: o.PVName},
		Spec: corev1.PersistentVolumeSpec{
			PersistentVolumeReclaimPolicy: reclaim,
			AccessModes:                   o.PVC.Spec.AccessModes,
			MountOptions:                  o.StorageClass.MountOptions,
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: o.PVC.Spec.Resources.Requests[corev1.ResourceStorage]},
			PersistentVolumeSource: corev1.PersistentVolumeSource{
				NFS: &corev1.NFSVolumeSource{Server: tg.server, Path: path.Join(tg.path, dir)},
			},
		},
	}
	p.log.Info().Str("pvc", o.PVC.Namespace+"/"+o.PVC.Name).Str("pv", o.PVName).Str("dir", dir).Msg("provisioned")
	return pv, controller.ProvisioningFinished, nil
}

// Delete archives or removes the volume's directory as the StorageClass's
// onDelete / archiveOnDelete parameters say (default: archive).
func (p *provisioner) Delete(ctx context.Context, pv *corev1.PersistentVolume) error {
	if pv.Spec.NFS == nil {
		return &controller.IgnoredError{Reason: "not an NFS volume"}
	}
	tg, active := p.current()
	if !active {
		return p.errNotRunning()
	}
	dir, ok := strings.CutPrefix(path.Clean(pv.Spec.NFS.Path), path.Clean(tg.path)+"/")
	if !ok || dir == "" || strings.Contains(dir, "..") {
		return fmt.Errorf("volume path %s is not below the export %s", pv.Spec.NFS.Path, tg.path)
	}
	params := map[string]string{}
	if name := pv.Spec.StorageClassName; name != "" {
		sc, err := p.client.StorageV1().StorageClasses().Get(ctx, name, metav1.GetOptions{})
		switch {
		case err == nil:
			params = sc.Parameters
		case !apierrors.IsNotFound(err):
			return fmt.Errorf("reading StorageClass %s: %w", name, err)
		}
	}
	m, err := nfs.Dial(ctx, tg.server, p.port, tg.path)
	if err != nil {
		return fmt.Errorf("mounting the NFS export: %w", err)
	}
	defer m.Close()
	exists, err := m.Exists(ctx, dir)
	if err != nil {
		return err
	}
	if !exists {
		p.log.Info().Str("pv", pv.Name).Str("dir", dir).Msg("directory already gone")
		return nil
	}
	switch params["onDelete"] {
	case "delete":
		return p.remove(ctx, m, pv, dir)
	case "retain":
		p.log.Info().Str("pv", pv.Name).Str("dir", dir).Msg("retained")
		return nil
	}
	if v, ok := params["archiveOnDelete"]; ok {
		archive, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("archiveOnDelete %q: %w", v, err)
		}
		if !archive {
			return p.remove(ctx, m, pv, dir)
		}
	}
	archived := path.Join(path.Dir(dir), "archived-"+path.Base(dir))
	if err := m.Rename(ctx, dir, archived); err != nil {
		return fmt.Errorf("archiving %s: %w", dir, err)
	}
	p.log.Info().Str("pv", pv.Name).Str("dir", archived).Msg("archived")
	return nil
}

func (p *provisioner) remove(ctx context.Context, m *nfs.Mount, pv *corev1.PersistentVolume, dir string) error {
	if err := m.RemoveAll(ctx, dir); err != nil {
		return err
	}
	p.log.Info().Str("pv", pv.Name).Str("dir", dir).Msg("deleted")
	return nil
}

var patternField = regexp.MustCompile(`\$\{\.PVC\.((?:labels|annotations)\.[^}]+|namespace|name)\}`)

// expandPathPattern fills ${.PVC.namespace}, ${.PVC.name},
// ${.PVC.labels.<key>} and ${.PVC.annotations.<key>}.
func expandPathPattern(pattern string, pvc *corev1.PersistentVolumeClaim) string {
	out := patternField.ReplaceAllStringFunc(pattern, func(m string) string {
		field := patternField.FindStringSubmatch(m)[1]
		switch {
		case field == "namespace":
			return pvc.Namespace
		case field == "name":
			return pvc.Name
		case strings.HasPrefix(field, "labels."):
			return pvc.Labels[strings.TrimPrefix(field, "labels.")]
		default:
			return pvc.Annotations[strings.TrimPrefix(field, "annotations.")]
		}
	})
	return strings.Trim(path.Clean("/"+out), "/")
}

// zerologSink sends the provisioning library's logr output to zerolog.
type zerologSink struct {
	log    zerolog.Logger
	name   string
	values []any
}

func (z zerologSink) Init(logr.RuntimeInfo)  {}
func (z zerologSink) Enabled(level int) bool { return level <= 1 }
func (z zerologSink) Info(level int, msg string, kv ...any) {
	z.log.Debug().Fields(append(append([]any{}, z.values...), kv...)).Str("logger", z.name).Msg(msg)
}
func (z zerologSink) Error(err error, msg string, kv ...any) {
	z.log.Warn().Err(err).Fields(append(append([]any{}, z.values...), kv...)).Str("logger", z.name).Msg(msg)
}
func (z zerologSink) WithValues(kv ...any) logr.LogSink {
	z.values = append(append([]any{}, z.values...), kv...)
	return z
}
func (z zerologSink) WithName(name string) logr.LogSink {
	if z.name != "" {
		name = z.name + "." + name
	}
	z.name = name
	return z
}
