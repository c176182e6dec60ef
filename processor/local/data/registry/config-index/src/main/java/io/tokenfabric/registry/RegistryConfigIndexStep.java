package io.tokenfabric.registry;

import java.util.ArrayList;
import java.util.List;

import org.eclipse.microprofile.config.inject.ConfigProperty;
import org.jboss.jandex.AnnotationInstance;
import org.jboss.jandex.AnnotationValue;
import org.jboss.jandex.DotName;

import apicurio.common.app.components.config.index.DynamicPropertiesInfoRecorder;
import io.apicurio.common.apps.config.Dynamic;
import io.apicurio.common.apps.config.DynamicConfigPropertyDef;
import io.apicurio.common.apps.config.DynamicConfigPropertyList;
import io.quarkus.arc.deployment.BeanDiscoveryFinishedBuildItem;
import io.quarkus.arc.deployment.SyntheticBeanBuildItem;
import io.quarkus.arc.processor.InjectionPointInfo;
import io.quarkus.deployment.annotations.BuildProducer;
import io.quarkus.deployment.annotations.BuildStep;
import io.quarkus.deployment.annotations.ExecutionTime;
import io.quarkus.deployment.annotations.Record;

/**
 * The registry's list of run-time-changeable settings, built from its own injection points.
 *
 * Every field injected with both {@code @ConfigProperty} and {@code @Dynamic} is a
 * {@code Supplier<T>}: its name, T and default value become one {@link DynamicConfigPropertyDef}. The
 * list is recorded for RUNTIME_INIT and offered as an unremovable synthetic
 * {@link DynamicConfigPropertyList} bean, which the registry's config storage injects.
 */
class RegistryConfigIndexStep {

    private static final DotName CONFIG_PROPERTY = DotName.createSimple(ConfigProperty.class.getName());
    private static final DotName DYNAMIC = DotName.createSimple(Dynamic.class.getName());

    @BuildStep
    @Record(ExecutionTime.RUNTIME_INIT)
    void dynamicProperties(DynamicPropertiesInfoRecorder recorder, BeanDiscoveryFinishedBuildItem discovery,
            BuildProducer<SyntheticBeanBuildItem> beans) throws ClassNotFoundException {
        List<DynamicConfigPropertyDef> defs = new ArrayList<>();
        for (InjectionPointInfo point : discovery.getInjectionPoints()) {
            AnnotationInstance property = point.getRequiredQualifier(CONFIG_PROPERTY);
            if (property == null || !point.isField() || point.getTarget().asField().annotation(DYNAMIC) == null) {
                continue;
            }
            String name = property.value("name").asString();
            AnnotationValue fallback = property.value("defaultValue");
            if (fallback == null) {
                throw new IllegalStateException("dynamic setting " + name + " has no default value");
            }
            String typeName = point.getRequiredType().asParameterizedType().arguments().get(0).name().toString();
            Class<?> type = Class.forName(typeName, false, Thread.currentThread().getContextClassLoader());
            defs.add(new DynamicConfigPropertyDef(name, type, fallback.asString()));
        }
        beans.produce(SyntheticBeanBuildItem.configure(DynamicConfigPropertyList.class)
                .runtimeValue(recorder.initializePropertiesInfo(defs))
                .unremovable()
                .setRuntimeInit()
                .done());
    }
}
