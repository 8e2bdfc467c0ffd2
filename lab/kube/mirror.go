package kube

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
)

// Mirror pod annotations kubelet sets (pkg/kubelet/types/pod_update.go at
// v1.36.1): the mirror mark with the static pod's hash, the hash, and the
// source. kwok is told to leave pods carrying the mirror mark alone
// (--disregard-status-with-annotation-selector): their status is the
// lab's to report, as it is kubelet's and not a fake runtime's.
const (
	AnnotationMirror = "kubernetes.io/config.mirror"
	annotationHash   = "kubernetes.io/config.hash"
	annotationSource = "kubernetes.io/config.source"
)

// MirrorPod is one control-plane static pod as its node's kubelet runs it.
type MirrorPod struct {
	// Name is the static pod's (kube-apiserver, kube-controller-manager,
	// kube-scheduler); the mirror pod is named "<Name>-<node>".
	Name  string
	Image string
	// Version is the Kubernetes version the static pod runs (its
	// app.kubernetes.io/version label).
	Version string
	Ready   bool
}

// SyncMirrorPods makes the API show node's control-plane static pods as
// its kubelet does: one mirror pod per static pod in kube-system, named
// "<name>-<node>" (generatePodName, pkg/kubelet/config/common.go), owned
// by the Node (mirror_client.go CreateMirrorPod), labelled as Talos
// renders the static pod (tier, k8s-app, component, app.kubernetes.io/*:
// internal/app/machined/pkg/controllers/k8s/control_plane_static_pod.go at
// Talos v1.13.3), its status the static pod's. A pod whose image changed
// is replaced (kubelet deletes a mirror pod whose hash no longer matches
// and creates the new one).
func (c *Cluster) SyncMirrorPods(ctx context.Context, node string, pods []MirrorPod) error {
	n, err := c.client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("mirror pods of %s: %w", node, err)
	}
	ip := ""
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			ip = a.Address
		}
	}
	// kubelet syncs each pod in its own worker (pkg/kubelet/pod_workers.go
	// at v1.36.1), so a node's mirror pods appear together, not one
	// after another.
	g, gctx := errgroup.WithContext(ctx)
	for _, p := range pods {
		g.Go(func() error {
			if err := c.syncMirrorPod(gctx, n, ip, p); err != nil {
				return fmt.Errorf("mirror pod %s of %s: %w", p.Name, node, err)
			}
			return nil
		})
	}
	return g.Wait()
}

func (c *Cluster) syncMirrorPod(ctx context.Context, n *corev1.Node, ip string, p MirrorPod) error {
	pods := c.client.CoreV1().Pods("kube-system")
	name := p.Name + "-" + strings.ToLower(n.Name)
	sum := sha256.Sum256([]byte(p.Name + "\x00" + p.Image + "\x00" + n.Name))
	hash := hex.EncodeToString(sum[:16])

	cur, err := pods.Get(ctx, name, metav1.GetOptions{})
	switch {
	case err == nil && cur.Annotations[AnnotationMirror] != hash:
		zero := int64(0)
		if err := pods.Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: &cur.UID}}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		cur = nil
	case apierrors.IsNotFound(err):
		cur = nil
	case err != nil:
		return err
	}
	if cur == nil {
		controller := true
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{
				Name: name, Namespace: "kube-system",
				Labels: map[string]string{
					"tier": "control-plane", "k8s-app": p.Name, "component": p.Name,
					"app.kubernetes.io/name": p.Name, "app.kubernetes.io/version": p.Version,
					"app.kubernetes.io/component": "control-plane", "app.kubernetes.io/managed-by": "Talos",
				},
				Annotations:     map[string]string{AnnotationMirror: hash, annotationHash: hash, annotationSource: "file"},
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: n.Name, UID: n.UID, Controller: &controller}},
			},
			Spec: corev1.PodSpec{
				NodeName: n.Name, HostNetwork: true, PriorityClassName: "system-cluster-critical",
				Containers:  []corev1.Container{{Name: p.Name, Image: p.Image, Command: []string{"/usr/local/bin/" + p.Name}}},
				Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute}},
			},
		}
		created, err := pods.Create(ctx, pod, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
		cur = created
	}
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		// The pod just read or created is the first try's; a conflict
		// reads it again.
		pod := cur
		cur = nil
		if pod == nil || pod.Name == "" {
			var err error
			if pod, err = pods.Get(ctx, name, metav1.GetOptions{}); err != nil {
				return err
			}
		}
		ready, now := corev1.ConditionFalse, metav1.Now()
		state := corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}}
		if p.Ready {
			ready = corev1.ConditionTrue
			state = corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}
		}
		pod.Status = corev1.PodStatus{
			Phase: corev1.PodRunning, HostIP: ip, PodIP: ip, StartTime: &now,
			Conditions: []corev1.PodCondition{
				{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: now},
				{Type: corev1.PodReady, Status: ready, LastTransitionTime: now},
				{Type: corev1.ContainersReady, Status: ready, LastTransitionTime: now},
				{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
			},
			ContainerStatuses: []corev1.ContainerStatus{{Name: p.Name, Image: p.Image, Ready: p.Ready, State: state}},
		}
		if ip != "" {
			pod.Status.PodIPs = []corev1.PodIP{{IP: ip}}
			pod.Status.HostIPs = []corev1.HostIP{{IP: ip}}
		}
		_, err = pods.UpdateStatus(ctx, pod, metav1.UpdateOptions{})
		return err
	})
}
