"""The numeric users the images run as: the image recipes (calcx.image.recipes) write them into
each image's passwd and group, and the manifests (calcx.k8s) run the pods as them."""

AGENT_UID = 10001
CONTROLLER_UID = 10002
