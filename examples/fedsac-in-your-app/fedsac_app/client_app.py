"""The ClientApp: pfl-flower's handlers, which build the configured method's client (FedSaCClient) on this
node's partition of the app's data. Add handlers of your own beside them."""
from flwr.clientapp import ClientApp

from clients.app import evaluate, handshake, train

app = ClientApp()
app.query("handshake")(handshake)  # tells the server the partition id, sizes and input shape
app.train()(train)
app.evaluate()(evaluate)
