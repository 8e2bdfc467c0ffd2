package kubetest

import (
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// FlannelDaemonSet is a CNI agent as flannel installs it (host network,
// labelled k8s-app: flannel, tolerating the not-ready taint): on a lab with
// the network gate its running pod makes its node Ready, as the CNI
// config it writes does on hardware.
func FlannelDaemonSet(namespace, name string) *appsv1.DaemonSet {
	labels := map[string]string{"app": "flannel", "k8s-app": "flannel", "tier": "node"}
	return &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: labels},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					HostNetwork: true,
					Containers:  []corev1.Container{{Name: "kube-flannel", Image: "ghcr.io/flannel-io/flannel:v0.28.4"}},
					Tolerations: []corev1.Toleration{
						{Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
						{Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute},
					},
				},
			},
		},
	}
}
