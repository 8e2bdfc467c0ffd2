package infra

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestAClaimMadeBeforeTheDefaultClassGetsIt: a claim without a class made
// while the cluster has no default StorageClass is given the default one
// made later, by the real kube-controller-manager's PersistentVolume
// controller on its next resync (pv_controller.go
// assignDefaultStorageClass; 15 s, --pvclaimbinder-sync-period). The flux
// stage runs beside this stage on that: a claim Flux's sources create
// first is not left without the NFS class.
func TestAClaimMadeBeforeTheDefaultClassGetsIt(t *testing.T) {
	lab, ctx := oneNodeLab(t, 4*time.Minute)
	cs := lab.Client()
	// The lab is shared: the claim and the default class go with the test.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = cs.CoreV1().PersistentVolumeClaims("default").Delete(ctx, "early", metav1.DeleteOptions{})
		_ = cs.StorageV1().StorageClasses().Delete(ctx, "nfs-storage", metav1.DeleteOptions{})
	})
	claim := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "early", Namespace: "default"},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Mi")}},
		},
	}
	if _, err := cs.CoreV1().PersistentVolumeClaims("default").Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	class := &storagev1.StorageClass{
		ObjectMeta:  metav1.ObjectMeta{Name: "nfs-storage", Annotations: map[string]string{DefaultClassAnnotation: "true"}},
		Provisioner: "cluster.local/nfs-provisioner-nfs-subdir-external-provisioner",
	}
	if _, err := cs.StorageV1().StorageClasses().Create(ctx, class, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// One resync (15 s) after the class exists, once the controller runs:
	// a controller manager that has just started (this test may be the
	// first on the shared lab) syncs its informers and takes its lease
	// first, which on a loaded 2-core CI run took longer than the 40 s
	// this wait had. A pass ends at the assignment; only a failure waits
	// the whole bound.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		got, err := cs.CoreV1().PersistentVolumeClaims("default").Get(ctx, "early", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if sc := got.Spec.StorageClassName; sc != nil && *sc == "nfs-storage" {
			return
		}
		if time.Now().After(deadline) {
			ev, _ := cs.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=early"})
			var seen []string
			for _, e := range ev.Items {
				seen = append(seen, e.Reason+": "+e.Message)
			}
			t.Fatalf("the claim made first still has class %v after 2 minutes; its events: %q", got.Spec.StorageClassName, seen)
		}
		time.Sleep(250 * time.Millisecond)
	}
}
